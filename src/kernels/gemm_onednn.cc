#include "kernels/gemm_onednn.h"

#include <dnnl.hpp>

#include <algorithm>
#include <functional>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

// Debian's oneDNN runs its kernels on OpenMP (libgomp). A product is one slice of oneTBB's work,
// so each calling thread asks OpenMP for a team of one: no threads beside oneTBB's (a bench asks
// for more, to compare with the library's own threading).
extern "C" void omp_set_num_threads(int);

namespace zoe::onednn {

namespace {

using dnnl::memory;

struct Key {
  bool bf16, ta, tb, bias, c_bf16;
  int M, N, K, lda, ldb, ldc, threads;
  float beta;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<float>()(k.beta);
    for (int v : {int(k.bf16), int(k.ta), int(k.tb), int(k.bias), int(k.c_bf16), k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.threads})
      h = h * 1000003u ^ size_t(v);
    return h;
  }
};

// A cached primitive with its memory objects and argument map: a call only points them at its
// operands. Creating three memory objects and a map per call cost about 2 us, as much as a
// 64x64x64 bf16 product (the attention's blocks make thousands of those a step).
struct Product {
  dnnl::matmul prim;
  memory a, b, c, bias;
  std::unordered_map<int, memory> args;
};

dnnl::engine& cpu() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// A row-major [rows, cols] matrix with row stride ld, or its transpose stored as [cols, rows].
memory::desc matrix(int rows, int cols, int ld, bool transposed, memory::data_type t) {
  memory::dims strides = transposed ? memory::dims{1, ld} : memory::dims{ld, 1};
  return memory::desc({rows, cols}, t, strides);
}

Product make(const Key& k) {
  auto t = k.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::desc a = matrix(k.M, k.K, k.lda, k.ta, t), b = matrix(k.K, k.N, k.ldb, k.tb, t),
                     c = matrix(k.M, k.N, k.ldc, false, k.c_bf16 ? memory::data_type::bf16 : memory::data_type::f32);
  const memory::desc bias = k.bias ? memory::desc({1, k.N}, memory::data_type::f32, memory::dims{k.N, 1}) : memory::desc();
  dnnl::primitive_attr attr;
  if (k.beta != 0) {  // C = beta C + product, as the post-op "sum"
    dnnl::post_ops ops;
    ops.append_sum(k.beta);
    attr.set_post_ops(ops);
  }
  auto desc = k.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
  dnnl::matmul::primitive_desc pd(desc, attr, cpu());
  Product p{dnnl::matmul(pd), memory(a, cpu(), DNNL_MEMORY_NONE), memory(b, cpu(), DNNL_MEMORY_NONE),
            memory(c, cpu(), DNNL_MEMORY_NONE), {}, {}};
  p.args = {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}};
  if (k.bias) {
    p.bias = memory(bias, cpu(), DNNL_MEMORY_NONE);
    p.args.emplace(DNNL_ARG_BIAS, p.bias);
  }
  return p;
}

}  // namespace

bool supported(bool bf16) {
  if (!bf16) return true;
  // oneDNN has a bf16 kernel from AVX512-BF16 on (AMX is a superset); elsewhere only its
  // reference loops, far slower than converting to fp32.
  auto bits = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & bits) == bits;
}

std::string isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

Status matmul(bool bf16, const GemmShape& s, const void* A, const void* B, float beta, void* C, bool c_bf16,
              const float* bias, int threads) {
  thread_local int team = 0;
  if (team != threads) omp_set_num_threads(team = std::max(1, threads));
  thread_local std::unordered_map<Key, Product, KeyHash> products;  // made for the team's size
  thread_local dnnl::stream stream(cpu());
  Key k{bf16, s.ta, s.tb, bias != nullptr, c_bf16, s.M, s.N, s.K, s.lda, s.ldb, s.ldc, team, beta};
  try {
    auto it = products.find(k);
    if (it == products.end()) it = products.emplace(k, make(k)).first;
    Product& p = it->second;
    p.a.set_data_handle(const_cast<void*>(A));
    p.b.set_data_handle(const_cast<void*>(B));
    p.c.set_data_handle(C);
    if (bias) p.bias.set_data_handle(const_cast<float*>(bias));
    p.prim.execute(stream, p.args);
    stream.wait();
  } catch (const dnnl::error& e) {
    return Status::Runtime(fmt::format("oneDNN {} matmul {}x{}x{}: {}", bf16 ? "bf16" : "fp32", s.M, s.N, s.K, e.what()));
  }
  return Status::Ok();
}

}  // namespace zoe::onednn

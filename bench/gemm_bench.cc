// `zoe bench gemm`: see gemm_bench.h. GFLOP/s are 2 M N K / seconds / 1e9.
#include "gemm_bench.h"

#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_process.h"
#include "zoe/dtype.h"

namespace zoe {

namespace {

struct Product {
  std::string name;
  GemmShape s;
  int per_step;  // how many a training step runs
};

// A linear layer [IC -> OC] as gpt2_ops_matmul.cc runs it: W is [IC, OC]; forward out = inp W,
// dinp = dout W^T, dW = inp^T dout; the tied head's wte is [V, C] (forward inp wte^T).
void add_linear(std::vector<Product>& v, const std::string& name, int rows, int IC, int OC, int n) {
  v.push_back({name + " forward", {false, false, rows, OC, IC, IC, OC, OC}, n});
  v.push_back({name + " dinp", {false, true, rows, IC, OC, OC, OC, IC}, n});
  v.push_back({name + " dW", {true, false, IC, OC, rows, IC, OC, OC}, n});
}

std::vector<Product> step_products(const GemmBenchOptions& o) {
  const int C = o.n_embd, V = o.vocab, R = o.rows, L = o.n_layer;
  std::vector<Product> v;
  add_linear(v, "qkv", R, C, 3 * C, L);
  add_linear(v, "attproj", R, C, C, L);
  add_linear(v, "fc", R, C, 4 * C, L);
  add_linear(v, "fcproj", R, 4 * C, C, L);
  v.push_back({"head forward", {false, true, R, V, C, C, C, V}, 1});
  v.push_back({"head dinp", {false, false, R, C, V, V, C, C}, 1});
  v.push_back({"head dwte", {true, false, V, C, R, V, C, C}, 1});
  return v;
}

// Small values, so no denormals or overflow; bf16 bit patterns or fp32.
std::vector<uint8_t> operand(size_t elems, GemmType t, unsigned seed) {
  std::vector<uint8_t> v(elems * (t == GemmType::kBF16 ? 2 : 4));
  for (size_t i = 0; i < elems; ++i) {
    const float x = float((i * 2654435761u + seed) % 1009) / 1009.f - 0.5f;
    if (t == GemmType::kBF16) {
      const uint16_t h = f32_to_bf16(x);
      std::memcpy(&v[i * 2], &h, 2);
    } else {
      std::memcpy(&v[i * 4], &x, 4);
    }
  }
  return v;
}

struct Ways {
  double whole1 = 0, whole_n = 0, zoe = 0;  // best seconds
};

// The best of at least `reps` runs and 0.05 s, after three warm-ups (which make the primitives).
template <class F>
Result<double> best_of_reps(int reps, F run) {
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < reps + 3 || spent < 0.05; ++rep) {
    const double t0 = now_s();
    ZOE_RETURN_IF_ERROR(run());
    const double dt = now_s() - t0;
    if (rep >= 3) best = std::min(best, dt), spent += dt;
  }
  return best;
}

// One way after the other, with a pause between: OpenMP's team spins after its product, and a
// way timed right after another met its spinning threads (zoe's slices ran at half speed when
// the ways took turns within a rep).
Result<Ways> time_product(GemmPath p, GemmType t, const GemmShape& s, int threads, int reps, const void* A,
                          const void* B, float* C) {
  Ways w;
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  ZOE_ASSIGN_OR_RETURN(w.whole1, best_of_reps(reps, [&] { return gemm(p, t, s, A, B, 0.f, C); }));
  pause();
  ZOE_ASSIGN_OR_RETURN(w.zoe, best_of_reps(reps, [&] { return gemm_sliced(p, t, s, A, B, 0.f, C); }));
  pause();
  ZOE_ASSIGN_OR_RETURN(w.whole_n, best_of_reps(reps, [&] { return gemm_threaded(p, t, s, A, B, 0.f, C, threads); }));
  pause();
  return w;
}

double gflops(const GemmShape& s, double seconds) { return 2.0 * s.M * s.N * s.K / seconds / 1e9; }

Status bench_type(const GemmBenchOptions& o, GemmType t, int threads, nlohmann::json* rows, std::FILE* human) {
  ZOE_ASSIGN_OR_RETURN(GemmPath p, gemm_path(t));
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  const std::vector<Product> products = step_products(o);
  size_t most_a = 0, most_b = 0, most_c = 0;
  for (const Product& x : products) {
    most_a = std::max(most_a, size_t(x.s.M) * x.s.K);
    most_b = std::max(most_b, size_t(x.s.K) * x.s.N);
    most_c = std::max(most_c, size_t(x.s.M) * x.s.N);
  }
  const std::vector<uint8_t> A = operand(most_a, t, 1), B = operand(most_b, t, 2);
  std::vector<float> C(most_c);
  const std::string lib = p == GemmPath::kOneDnn ? "oneDNN " + gemm_onednn_isa() : gemm_path_name(p);
  if (human)
    std::fprintf(human, "# %s via %s, %d thread(s); GFLOP/s, best of >= %d reps\n# %-16s %18s %5s | %9s %9s %9s | %9s\n",
                 gemm_type_name(t), lib.c_str(), threads, o.reps, "product", "M x K x N", "ta tb", "whole 1",
                 fmt::format("whole {}", threads).c_str(), "zoe", "zoe/best");
  double zoe_s = 0, best_s = 0;
  for (const Product& x : products) {
    ZOE_ASSIGN_OR_RETURN(Ways w, time_product(p, t, x.s, threads, o.reps, A.data(), B.data(), C.data()));
    const double best = std::min(w.whole1, w.whole_n);
    zoe_s += x.per_step * w.zoe;
    best_s += x.per_step * best;
    rows->push_back({{"type", gemm_type_name(t)}, {"path", gemm_path_name(p)}, {"threads", threads},
                     {"product", x.name}, {"M", x.s.M}, {"K", x.s.K}, {"N", x.s.N}, {"ta", x.s.ta}, {"tb", x.s.tb},
                     {"per_step", x.per_step}, {"whole_1_thread_gflops", gflops(x.s, w.whole1)},
                     {"whole_threads_gflops", gflops(x.s, w.whole_n)}, {"zoe_gflops", gflops(x.s, w.zoe)},
                     {"zoe_to_best", best / w.zoe}});
    if (human)
      std::fprintf(human, "  %-16s %5d x %4d x %4d %2d %2d | %9.0f %9.0f %9.0f | %9.2f\n", x.name.c_str(), x.s.M,
                   x.s.K, x.s.N, int(x.s.ta), int(x.s.tb), gflops(x.s, w.whole1), gflops(x.s, w.whole_n),
                   gflops(x.s, w.zoe), best / w.zoe);
  }
  rows->push_back({{"type", gemm_type_name(t)}, {"path", gemm_path_name(p)}, {"threads", threads},
                   {"product", "the step's products"}, {"zoe_s", zoe_s}, {"best_s", best_s},
                   {"zoe_to_best", best_s / zoe_s}});
  if (human)
    std::fprintf(human, "  the step's products together: zoe %.2f ms, the best whole way per shape %.2f ms: %.2f\n",
                 zoe_s * 1e3, best_s * 1e3, best_s / zoe_s);
  return Status::Ok();
}

}  // namespace

Status bench_gemm(const GemmBenchOptions& o, nlohmann::json* out, std::FILE* human) {
  if (o.n_embd < 1 || o.vocab < 1 || o.rows < 1 || o.reps < 1)
    return Status::Invalid("bench gemm: n_embd, vocabulary, rows and --iters must be at least 1");
  std::vector<int> threads = o.threads;
  if (threads.empty()) threads = {static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};
  if (human)
    std::fprintf(human, "# zoe bench gemm: the training step's products (GPT-2 n_embd %d, %d layers, vocab %d, %d rows);\n"
                 "# whole 1: the product on one thread; whole N: the library's own N threads; zoe: slices over "
                 "oneTBB (kernels/gemm.h)\n", o.n_embd, o.n_layer, o.vocab, o.rows);
  nlohmann::json rows = nlohmann::json::array();
  for (int n : threads) {
    if (n < 1) return Status::Invalid("bench gemm: --threads must be at least 1");
    for (GemmType t : o.types) ZOE_RETURN_IF_ERROR(bench_type(o, t, n, &rows, human));
  }
  *out = {{"bench", "gemm"}, {"onednn_isa", gemm_onednn_isa()}, {"n_embd", o.n_embd}, {"n_layer", o.n_layer},
          {"vocab", o.vocab}, {"rows", o.rows}, {"results", rows}};
  return Status::Ok();
}

}  // namespace zoe

// `zoe bench adam`: adam_step's effective GB/s against its no-arithmetic ceiling and against
// torch.optim.AdamW, all measured in this run. Effective bytes per element: the gradient read,
// master / exp_avg / exp_avg_sq each read and written (24), the weight copy written.
#include "adam_bench.h"

#include <sys/mman.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "adam_ceiling.h"
#include "bench_process.h"
#include "kernels/adam.h"
#include "kernels/parallel_chunks.h"

namespace zoe {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

// 2 MiB-aligned, with transparent huge pages asked for (fewer TLB misses for both kernels
// alike; the advice may be refused, which changes nothing but speed).
Status alloc_buffer(size_t bytes, HostBuffer* out) {
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (!p) return Status::OutOfMemory("bench adam: cannot allocate " + std::to_string(rounded) + " bytes");
  (void)madvise(p, rounded, MADV_HUGEPAGE);
  out->reset(static_cast<uint8_t*>(p));
  return Status::Ok();
}

// One size's arrays. The gradient buffer is fp32-sized so every gradient dtype fits.
struct AdamBuffers {
  size_t n = 0;
  DType param_dtype = DType::kBF16;
  HostBuffer grad, master, m, v, out;

  AdamRange range(DType grad_dtype) const {
    AdamRange r;
    r.grad = grad.get();
    r.grad_dtype = grad_dtype;
    r.master = reinterpret_cast<float*>(master.get());
    r.exp_avg = reinterpret_cast<float*>(m.get());
    r.exp_avg_sq = reinterpret_cast<float*>(v.get());
    r.param_out = out.get();
    r.param_dtype = param_dtype;
    r.n = n;
    return r;
  }
};

// A cheap deterministic value in [-1, 1) per index: no RNG state to share between threads.
float hash_unit(size_t i, uint32_t salt) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9e3779b1u ^ salt;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// Writes every page (the first touch costs seconds per GiB: never inside a timing) with the
// threads that will run the kernels, so pages sit where those threads run.
void fill_state(const AdamBuffers& b, int threads) {
  const AdamRange r = b.range(DType::kF32);
  (void)parallel_chunks(b.n, threads, [&](size_t begin, size_t end) -> size_t {
    for (size_t i = begin; i < end; ++i) {
      r.master[i] = hash_unit(i, 1);
      r.exp_avg[i] = 0.01f * hash_unit(i, 2);
      r.exp_avg_sq[i] = 1e-4f * (hash_unit(i, 3) + 1.0f);
      store_from_f32(r.param_out, b.param_dtype, i, r.master[i]);
    }
    return 0;
  });
}

void fill_grads(const AdamBuffers& b, DType grad_dtype, int threads) {
  void* grad = b.grad.get();
  (void)parallel_chunks(b.n, threads, [&](size_t begin, size_t end) -> size_t {
    for (size_t i = begin; i < end; ++i) store_from_f32(grad, grad_dtype, i, hash_unit(i, 4));
    return 0;
  });
}

Status make_buffers(size_t n, DType param_dtype, int threads, AdamBuffers* b) {
  b->n = n;
  b->param_dtype = param_dtype;
  ZOE_RETURN_IF_ERROR(alloc_buffer(n * 4, &b->grad));
  ZOE_RETURN_IF_ERROR(alloc_buffer(n * 4, &b->master));
  ZOE_RETURN_IF_ERROR(alloc_buffer(n * 4, &b->m));
  ZOE_RETURN_IF_ERROR(alloc_buffer(n * 4, &b->v));
  ZOE_RETURN_IF_ERROR(alloc_buffer(n * dtype_size(param_dtype), &b->out));
  fill_state(*b, threads);
  fill_grads(*b, DType::kF32, threads);
  return Status::Ok();
}

struct AdamTiming {
  double best_s = 0, median_s = 0;
};

AdamTiming summarize(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

struct CaseResult {
  AdamTiming adam, ceiling;
  size_t nonfinite = 0;
};

// Adam and its ceiling alternate rep by rep, so drift in the machine hits both alike.
CaseResult time_case(const AdamBuffers& b, DType grad_dtype, int threads, int iterations, Isa isa) {
  const AdamRange r = b.range(grad_dtype);
  AdamHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.01;
  CaseResult res;
  std::vector<double> adam_t, ceil_t;
  adam_traffic(r, isa, threads);  // warm-up: threads started, caches and TLBs in steady state
  res.nonfinite += adam_step(h, r, isa, threads);
  for (int rep = 0; rep < iterations; ++rep) {
    double t0 = now_s();
    adam_traffic(r, isa, threads);
    double t1 = now_s();
    h.step = rep + 2;
    res.nonfinite += adam_step(h, r, isa, threads);
    double t2 = now_s();
    ceil_t.push_back(t1 - t0);
    adam_t.push_back(t2 - t1);
  }
  res.adam = summarize(adam_t);
  res.ceiling = summarize(ceil_t);
  return res;
}

// torch.optim.AdamW on the same size and thread count, as a subprocess (bench/torch_adam.py).
struct TorchResult {
  bool ok = false;
  std::string why, version, variant;
  double best_s = 0;
};

TorchResult run_torch(const BenchAdamOptions& o, size_t n, int threads) {
  TorchResult res;
  // glibc would hand torch's per-step temporaries back to the kernel and fault them in again
  // each step (seconds per GiB here): keep them in the heap, torch's best case.
  const std::string cmd = "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 " +
                          shell_quote(o.python) + " " + shell_quote(std::string(ZOE_SOURCE_DIR) + "/bench/torch_adam.py") +
                          " --n " + std::to_string(n) + " --threads " + std::to_string(threads) + " --iters " +
                          std::to_string(o.torch_iterations) + " 2>&1";
  int code = 0;
  auto ran = run_capture(cmd, &code);
  if (!ran.ok()) {
    res.why = "cannot start " + o.python;
    return res;
  }
  std::string output = std::move(*ran);
  // The script's last line is its JSON answer, also when torch is missing.
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const size_t nl = output.rfind('\n');
  const std::string last = output.substr(nl == std::string::npos ? 0 : nl + 1);
  const nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
  if (!j.is_object()) {
    res.why = "torch_adam.py exited with code " + std::to_string(code) + ": " + output.substr(0, 300);
    return res;
  }
  if (!j.value("ok", false)) {
    res.why = j.value("why", std::string("torch_adam.py failed"));
    return res;
  }
  res.version = j.value("torch_version", std::string());
  for (const auto& [name, v] : j["variants"].items()) {
    if (!v.contains("best_s")) continue;
    const double s = v["best_s"].get<double>();
    if (!res.ok || s < res.best_s) res = {true, "", res.version, name, s};
  }
  if (!res.ok) res.why = "no torch AdamW variant ran: " + j["variants"].dump();
  return res;
}

double gbps(double bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0; }

std::string case_name(const char* kind, size_t n, DType g, DType p, int threads) {
  return std::string("adam/") + kind + " n=" + std::to_string(n) + " grad=" + std::string(dtype_name(g)) +
         " param=" + std::string(dtype_name(p)) + " threads=" + std::to_string(threads);
}

}  // namespace

Status bench_adam(const BenchAdamOptions& o, nlohmann::json* out, std::FILE* human) {
  if (o.sizes.empty() || o.grad_dtypes.empty() || o.threads.empty() || o.iterations < 1)
    return Status::Invalid("bench adam: sizes, grad dtypes, threads must be non-empty and iterations >= 1");
  const Isa isa = best_isa();
  const int max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json torch_info = {{"requested", o.torch}};
  bool torch_usable = o.torch;
  if (human)
    std::fprintf(human, "# zoe bench adam: isa %s, weight copy %s, best of %d reps; bytes/elem = grad + 24 + copy\n"
                 "# %12s %5s %4s %7s %10s %10s %10s %7s\n", isa_name(isa), std::string(dtype_name(o.param_dtype)).c_str(),
                 o.iterations, "elements", "grad", "thr", "B/elem", "adam_ms", "adam_GB/s", "ceil_GB/s", "ratio");
  struct ZoeTime { size_t n; DType g; int threads; double s, bytes; };
  for (size_t n : o.sizes) {
    std::vector<ZoeTime> zoe_times;
    {  // this size's buffers live only in this scope: one size in memory at a time, none during torch
      AdamBuffers b;
      ZOE_RETURN_IF_ERROR(make_buffers(n, o.param_dtype, max_threads, &b));
      for (DType g : o.grad_dtypes) {
        fill_grads(b, g, max_threads);
        const double bytes = static_cast<double>(n) * (dtype_size(g) + 24 + dtype_size(o.param_dtype));
        for (int t : o.threads) {
          const CaseResult c = time_case(b, g, t, o.iterations, isa);
          const double adam_gbps = gbps(bytes, c.adam.best_s), ceil_gbps = gbps(bytes, c.ceiling.best_s);
          results.push_back({{"case", case_name("ceiling", n, g, o.param_dtype, t)}, {"measured", adam_gbps},
                             {"baseline", ceil_gbps}, {"ratio", adam_gbps / ceil_gbps}, {"unit", "GB/s"},
                             {"goal", 0.90}, {"elements", n}, {"grad_dtype", dtype_name(g)},
                             {"param_dtype", dtype_name(o.param_dtype)}, {"threads", t}, {"isa", isa_name(isa)},
                             {"bytes_per_element", bytes / n}, {"adam_best_s", c.adam.best_s},
                             {"adam_median_s", c.adam.median_s}, {"ceiling_best_s", c.ceiling.best_s},
                             {"ceiling_median_s", c.ceiling.median_s}, {"nonfinite", c.nonfinite}});
          zoe_times.push_back({n, g, t, c.adam.best_s, bytes});
          if (human) {
            std::fprintf(human, "  %12zu %5s %4d %7.0f %10.2f %10.2f %10.2f %7.3f\n", n,
                         std::string(dtype_name(g)).c_str(), t, bytes / n, c.adam.best_s * 1e3, adam_gbps, ceil_gbps,
                         adam_gbps / ceil_gbps);
            std::fflush(human);
          }
        }
      }
    }
    if (!torch_usable) continue;
    for (int t : o.threads) {
      const TorchResult tr = run_torch(o, n, t);
      if (!tr.ok) {
        torch_info["available"] = false;
        torch_info["why"] = tr.why;
        if (human) std::fprintf(human, "# torch rows skipped: %s\n", tr.why.c_str());
        torch_usable = false;  // zoe's own rows go on without it
        break;
      }
      torch_info["available"] = true;
      torch_info["version"] = tr.version;
      for (const ZoeTime& z : zoe_times) {
        if (z.threads != t) continue;
        const double zoe_gbps = gbps(z.bytes, z.s), torch_gbps = gbps(z.bytes, tr.best_s);
        results.push_back({{"case", case_name("torch", n, z.g, o.param_dtype, t)}, {"measured", zoe_gbps},
                           {"baseline", torch_gbps}, {"ratio", tr.best_s / z.s}, {"unit", "GB/s"}, {"goal", 2.5},
                           {"elements", n}, {"grad_dtype", dtype_name(z.g)}, {"param_dtype", dtype_name(o.param_dtype)},
                           {"threads", t}, {"zoe_best_s", z.s}, {"torch_best_s", tr.best_s},
                           {"torch_variant", tr.variant}, {"torch_version", tr.version},
                           {"note", "torch: fp32 params and grads, no weight copy; GB/s on zoe's bytes"}});
        if (human) {
          std::fprintf(human, "# vs torch %s AdamW(%s): n=%zu grad=%s thr=%d  zoe %.2f ms  torch %.2f ms  speedup %.2fx\n",
                       tr.version.c_str(), tr.variant.c_str(), n, std::string(dtype_name(z.g)).c_str(), t, z.s * 1e3,
                       tr.best_s * 1e3, tr.best_s / z.s);
          std::fflush(human);
        }
      }
    }
  }
  if (out) *out = {{"bench", "adam"}, {"isa", isa_name(isa)}, {"torch", torch_info}, {"results", results}};
  return Status::Ok();
}

}  // namespace zoe

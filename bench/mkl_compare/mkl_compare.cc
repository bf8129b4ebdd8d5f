// oneMKL's bf16 GEMM (cblas_gemm_bf16bf16f32, loaded at run time from PyPI's `mkl` wheel) against
// oneDNN as zoe runs it, on the GPT-2 step's products (`zoe bench gemm`'s shapes), in one process:
// oneDNN whole on its own threads, zoe's slices over oneTBB, oneMKL whole on its own threads.
// Issue 51 asks for oneMKL to be measured and adopted only where it wins. Build and run:
//   bench/mkl_compare/run.sh   (installs the wheel into a venv under out/, builds, runs)
// GFLOP/s, best of 20 reps after 3 warm-ups, 2 threads (argv[1] to change).
#include <dlfcn.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/gemm.h"

namespace {

enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };
using MklGemm = void (*)(int, int, int, int, int, int, float, const uint16_t*, int, const uint16_t*, int, float,
                         float*, int);
using MklThreads = void (*)(int);

struct Shape {
  const char* name;
  int M, K, N;
  bool ta, tb;
};
// zoe bench gemm's: GPT-2 L6 C384, B4 T256 (N = 1024 rows), V 256.
const Shape kShapes[] = {
    {"qkv forward", 1024, 384, 1152, false, false},   {"qkv dinp", 1024, 1152, 384, false, true},
    {"qkv dW", 384, 1024, 1152, true, false},         {"attproj forward", 1024, 384, 384, false, false},
    {"attproj dinp", 1024, 384, 384, false, true},    {"attproj dW", 384, 1024, 384, true, false},
    {"fc forward", 1024, 384, 1536, false, false},    {"fc dinp", 1024, 1536, 384, false, true},
    {"fc dW", 384, 1024, 1536, true, false},          {"fcproj forward", 1024, 1536, 384, false, false},
    {"fcproj dinp", 1024, 384, 1536, false, true},    {"fcproj dW", 1536, 1024, 384, true, false},
    {"head forward", 1024, 384, 256, false, true},    {"head dinp", 1024, 256, 384, false, false},
    {"head dwte", 256, 1024, 384, true, false},
};

double best_seconds(const std::function<void()>& f) {
  for (int i = 0; i < 3; i++) f();
  double best = 1e9;
  for (int i = 0; i < 20; i++) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  void* mkl = dlopen("libmkl_rt.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!mkl) return std::fprintf(stderr, "cannot load libmkl_rt.so.2: %s\n", dlerror()), 2;
  auto gemm = reinterpret_cast<MklGemm>(dlsym(mkl, "cblas_gemm_bf16bf16f32"));
  auto set_threads = reinterpret_cast<MklThreads>(dlsym(mkl, "MKL_Set_Num_Threads"));
  if (!gemm || !set_threads) return std::fprintf(stderr, "libmkl_rt.so.2 lacks cblas_gemm_bf16bf16f32\n"), 2;
  set_threads(threads);
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  std::printf("# bf16 x bf16 -> fp32, %d thread(s); GFLOP/s, best of 20 reps\n", threads);
  std::printf("# %-16s %5s %5s %5s %2s %2s | %12s %10s %10s | %8s\n", "product", "M", "K", "N", "ta", "tb",
              "oneDNN whole", "zoe slices", "oneMKL", "mkl/best");
  double sum_best = 0, sum_mkl = 0;
  for (const Shape& s : kShapes) {
    std::vector<uint16_t> a(size_t(s.M) * s.K, 0x3f80), b(size_t(s.K) * s.N, 0x3f80);
    std::vector<float> c(size_t(s.M) * s.N);
    for (size_t i = 0; i < a.size(); i++) a[i] = uint16_t(0x3c00 + i % 512);
    for (size_t i = 0; i < b.size(); i++) b[i] = uint16_t(0x3c00 + i % 509);
    zoe::GemmShape g{s.ta, s.tb, s.M, s.N, s.K, s.ta ? s.M : s.K, s.tb ? s.K : s.N, s.N};
    const double flop = 2.0 * s.M * s.N * s.K;
    double whole = best_seconds([&] {
      (void)zoe::gemm_threaded(zoe::GemmPath::kOneDnn, zoe::GemmType::kBF16, g, a.data(), b.data(), 0.f, c.data(),
                               threads);
    });
    double sliced = best_seconds([&] {
      (void)zoe::gemm_sliced(zoe::GemmPath::kOneDnn, zoe::GemmType::kBF16, g, a.data(), b.data(), 0.f, c.data());
    });
    double mk = best_seconds([&] {
      gemm(kRowMajor, s.ta ? kTrans : kNoTrans, s.tb ? kTrans : kNoTrans, s.M, s.N, s.K, 1.f, a.data(), g.lda,
           b.data(), g.ldb, 0.f, c.data(), g.ldc);
    });
    const double best = std::min(whole, sliced);
    sum_best += best, sum_mkl += mk;
    std::printf("  %-16s %5d %5d %5d %2d %2d | %12.0f %10.0f %10.0f | %8.2f\n", s.name, s.M, s.K, s.N, s.ta, s.tb,
                flop / whole / 1e9, flop / sliced / 1e9, flop / mk / 1e9, best / mk);
  }
  std::printf("# the 15 products once each: oneMKL %.2f ms, the better of oneDNN's two ways %.2f ms: %.2f\n",
              sum_mkl * 1e3, sum_best * 1e3, sum_best / sum_mkl);
  return 0;
}

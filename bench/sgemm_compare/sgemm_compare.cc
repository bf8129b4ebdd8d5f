// Times row-major sgemm of one BLAS library at the GPT-2 shapes the CPU ops use, and checks
// sampled entries against a float64 dot product. Built once per library (they all export
// cblas_sgemm, so they cannot share a binary); the commands are in bench/RESULTS.md.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#if defined(USE_DNNL)
#include <oneapi/dnnl/dnnl.h>
static const char* kLib = "onednn";
#else
#include <cblas.h>
#if defined(USE_BLIS)
static const char* kLib = "blis";
#else
static const char* kLib = "openblas";
#endif
#endif

static void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
                 int ldb, float* C, int ldc) {
#if defined(USE_DNNL)
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.f, A, lda, B, ldb, 0.f, C, ldc);
#else
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, 1.f, A, lda, B, ldb, 0.f, C, ldc);
#endif
}

// C[M,N] = op(A) op(B), row-major. ta: A stored [K,M]; tb: B stored [N,K].
// chunk > 0 (NT only): N is cut into column blocks of `chunk`, one call each, as an LM head
// over vocabulary slices would do.
static void sgemm(bool ta, bool tb, int M, int N, int K, const float* A, const float* B, float* C,
                  int chunk) {
  const int lda = ta ? M : K, ldb = tb ? K : N;
  if (chunk <= 0) return gemm(ta, tb, M, N, K, A, lda, B, ldb, C, N);
  for (int n0 = 0; n0 < N; n0 += chunk)
    gemm(ta, tb, M, std::min(chunk, N - n0), K, A, lda, B + (size_t)n0 * K, ldb, C + n0, N);
}

static double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct Shape { const char* what; bool ta, tb; int M, N, K; int reps; int chunk = 0; };

int main() {
  const Shape shapes[] = {
      {"fwd qkv      NN", false, false, 2048, 1152, 384, 8},
      {"fwd attproj  NN", false, false, 2048, 384, 384, 8},
      {"fwd fc       NN", false, false, 2048, 1536, 384, 8},
      {"fwd fcproj   NN", false, false, 2048, 384, 1536, 8},
      {"dinp fc      NT", false, true, 2048, 384, 1536, 8},
      {"dinp fcproj  NT", false, true, 2048, 1536, 384, 8},
      {"dW fc        TN", true, false, 384, 1536, 2048, 8},
      {"dW fcproj    TN", true, false, 1536, 384, 2048, 8},
      {"fwd C=768 fc NN", false, false, 2048, 3072, 768, 4},
      {"dW C=768 fc  TN", true, false, 768, 3072, 2048, 4},
      {"lm head      NT", false, true, 2048, 50257, 384, 2},
      {"lm head /4096 NT", false, true, 2048, 50257, 384, 2, 4096},
      {"lm dinp      NN", false, false, 2048, 384, 50257, 2},
      {"lm dwte      TN", true, false, 50257, 384, 2048, 2},
  };
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  double total = 0;
  for (const Shape& s : shapes) {
    std::vector<float> A((size_t)s.M * s.K), B((size_t)s.K * s.N), C((size_t)s.M * s.N);
    for (auto& x : A) x = d(rng);
    for (auto& x : B) x = d(rng);
    sgemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), B.data(), C.data(), s.chunk);  // warm-up
    // Wall time, and process CPU time: on a shared machine the CPU time of a 1-thread run is
    // the figure least disturbed by other processes.
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < s.reps; r++) {
      auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      sgemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), B.data(), C.data(), s.chunk);
      best_cpu = std::min(best_cpu, cpu_seconds() - c0);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // Sampled check: error relative to sum |a*b| (the scale float rounding works at).
    double worst = 0;
    for (int t = 0; t < 200; t++) {
      int i = rng() % s.M, j = rng() % s.N;
      double acc = 0, mag = 0;
      for (int k = 0; k < s.K; k++) {
        double a = s.ta ? A[(size_t)k * s.M + i] : A[(size_t)i * s.K + k];
        double b = s.tb ? B[(size_t)j * s.K + k] : B[(size_t)k * s.N + j];
        acc += a * b;
        mag += std::fabs(a * b);
      }
      worst = std::max(worst, std::fabs(C[(size_t)i * s.N + j] - acc) / mag);
    }
    double gflops = 2.0 * s.M * s.N * s.K / best / 1e9;
    total += best;
    std::printf("%-9s %-16s M=%5d N=%5d K=%5d  %8.2f ms  %7.1f GFLOP/s  cpu %8.2f ms  relerr %.1e%s\n",
                kLib, s.what, s.M, s.N, s.K, best * 1e3, gflops, best_cpu * 1e3, worst,
                worst < 1e-5 ? "" : "  WRONG");
  }
  std::printf("%-9s sum of best times %.1f ms\n", kLib, total * 1e3);
}

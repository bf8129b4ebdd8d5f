#include "kernels/gemm.h"

#include <cblas.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kernels/gemm_onednn.h"
#include "zoe/dtype.h"

namespace zoe {

namespace {

template <typename LoadA, typename LoadB>
void reference(const GemmShape& s, LoadA a, LoadB b, float beta, float* C) {
  for (int i = 0; i < s.M; ++i)
    for (int j = 0; j < s.N; ++j) {
      float acc = 0;
      for (int k = 0; k < s.K; ++k)
        acc += a(s.ta ? int64_t{k} * s.lda + i : int64_t{i} * s.lda + k) *
               b(s.tb ? int64_t{j} * s.ldb + k : int64_t{k} * s.ldb + j);
      float& c = C[int64_t{i} * s.ldc + j];
      c = beta == 0 ? acc : acc + beta * c;  // beta 0 never reads C (it may be uninitialised)
    }
}

// OpenBLAS's thread count is the process's: each product sets the one it wants (1 but in
// gemm_threaded).
void openblas_threads(int n) {
  if (openblas_get_num_threads() != n) openblas_set_num_threads(n);
}

// The stored matrix (rows x cols, row stride ld) of bf16 bit patterns as compact fp32.
const float* widen(const void* src, int rows, int cols, int ld, std::vector<float>& dst) {
  const auto* h = static_cast<const uint16_t*>(src);
  dst.resize(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[size_t(r) * cols + c] = bf16_to_f32(h[int64_t{r} * ld + c]);
  return dst.data();
}

void openblas(const GemmShape& s, const float* A, int lda, const float* B, int ldb, float beta, float* C,
              int threads = 1) {
  openblas_threads(threads);
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.f,
              A, lda, B, ldb, beta, C, s.ldc);
}

Result<GemmPath> parse_path(const char* var, GemmType t) {
  const char* v = std::getenv(var);
  GemmPath p;
  std::string_view s = v ? v : "";
  if (s == "reference") p = GemmPath::kReference;
  else if (s == "openblas") p = GemmPath::kOpenBlas;
  else if (s == "onednn") p = GemmPath::kOneDnn;
  else return Status::Invalid(fmt::format("{}='{}': expected reference, openblas or onednn", var, s));
  if (!gemm_supported(p, t))
    return Status::Unsupported(fmt::format("{}={}: no {} GEMM on that path here (oneDNN finds {})", var, s,
                                           gemm_type_name(t), gemm_onednn_isa()));
  return p;
}

}  // namespace

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kOpenBlas: return "openblas";
    case GemmPath::kOneDnn: return "onednn";
    default: return "reference";
  }
}

const char* gemm_type_name(GemmType t) { return t == GemmType::kBF16 ? "bf16" : "fp32"; }

bool gemm_supported(GemmPath p, GemmType t) {
  switch (p) {
    case GemmPath::kReference: return true;
    case GemmPath::kOpenBlas: return true;  // bf16: widened to fp32 first
    case GemmPath::kOneDnn: return onednn::supported(t == GemmType::kBF16);
  }
  return false;
}

std::string gemm_onednn_isa() { return onednn::isa(); }

Result<GemmPath> gemm_path(GemmType t) {
  const char* var = t == GemmType::kBF16 ? "ZOE_GEMM_BF16" : "ZOE_GEMM_F32";
  if (const char* v = std::getenv(var); v && *v) return parse_path(var, t);
  if (t == GemmType::kF32) return GemmPath::kOpenBlas;
  return gemm_supported(GemmPath::kOneDnn, t) ? GemmPath::kOneDnn : GemmPath::kOpenBlas;
}

// C = bias (each row) + beta C, for the paths without a bias argument: the product then adds onto it.
static void seed_rows(const GemmShape& s, float beta, float* C, const float* bias) {
  for (int64_t r = 0; r < s.M; ++r) {
    float* c = C + r * s.ldc;
    for (int j = 0; j < s.N; ++j) c[j] = beta == 0.f ? bias[j] : bias[j] + beta * c[j];
  }
}

Status gemm(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, float* C,
            const float* bias) {
  if (!gemm_supported(p, t))
    return Status::Unsupported(fmt::format("no {} GEMM through {} here", gemm_type_name(t), gemm_path_name(p)));
  if (s.M == 0 || s.N == 0) return Status::Ok();
  if (p == GemmPath::kOneDnn) return onednn::matmul(t == GemmType::kBF16, s, A, B, beta, C, false, bias);
  if (bias) {
    seed_rows(s, beta, C, bias);
    beta = 1.f;
  }
  switch (p) {
    case GemmPath::kOpenBlas:
      if (t == GemmType::kBF16) {
        thread_local std::vector<float> a, b;
        const int a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
        const int b_rows = s.tb ? s.N : s.K, b_cols = s.tb ? s.K : s.N;
        openblas(s, widen(A, a_rows, a_cols, s.lda, a), a_cols, widen(B, b_rows, b_cols, s.ldb, b), b_cols, beta, C);
      } else {
        openblas(s, static_cast<const float*>(A), s.lda, static_cast<const float*>(B), s.ldb, beta, C);
      }
      return Status::Ok();
    case GemmPath::kOneDnn:
    case GemmPath::kReference: break;
  }
  if (t == GemmType::kBF16) {
    auto a = [A](int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(A)[i]); };
    auto b = [B](int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(B)[i]); };
    reference(s, a, b, beta, C);
  } else {
    auto a = [A](int64_t i) { return static_cast<const float*>(A)[i]; };
    auto b = [B](int64_t i) { return static_cast<const float*>(B)[i]; };
    reference(s, a, b, beta, C);
  }
  return Status::Ok();
}

Status gemm(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, uint16_t* C, const float* bias) {
  if (!gemm_supported(p, t))
    return Status::Unsupported(fmt::format("no {} GEMM through {} here", gemm_type_name(t), gemm_path_name(p)));
  if (s.M == 0 || s.N == 0) return Status::Ok();
  // oneDNN writes bf16 from bf16 operands itself (2.6 has no fp32 -> bf16 matmul).
  if (p == GemmPath::kOneDnn && t == GemmType::kBF16) return onednn::matmul(true, s, A, B, 0.f, C, true, bias);
  thread_local std::vector<float> f;  // the fp32 result, compact, then rounded into C
  f.resize(size_t(s.M) * s.N);
  GemmShape g = s;
  g.ldc = s.N;
  ZOE_RETURN_IF_ERROR(gemm(p, t, g, A, B, 0.f, f.data(), bias));
  for (int64_t r = 0; r < s.M; ++r)
    for (int64_t j = 0; j < s.N; ++j) C[r * s.ldc + j] = f32_to_bf16(f[r * s.N + j]);
  return Status::Ok();
}

// Slices of about 256 in an even count of equal widths (multiples of 16), from the shape alone:
// two workers end together. Five 256-wide slices of a 1152-wide product (qkv) kept one of two
// cores idle a fifth of it, 256 + 128 of a 384-wide one a third (RESULTS, "GEMM slices").
// at_least_two: a large product of 256 or fewer rows in two slices, not one (the head's 256 x
// 1024 x 384 weight gradient ran on one of two cores, 0.61 of oneDNN's own two threads).
static int64_t slice_width(int64_t extent, bool at_least_two) {
  constexpr int64_t kTarget = 256;
  int64_t n = (extent + kTarget - 1) / kTarget;
  if (at_least_two && extent >= 64) n = std::max<int64_t>(n, 2);
  if (n > 1 && n % 2) n++;
  const int64_t w = (extent + n - 1) / n;
  return (w + 15) / 16 * 16;
}

namespace {

Status gemm_into(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, float* C,
                 const float* bias) {
  return gemm(p, t, s, A, B, beta, C, bias);
}
Status gemm_into(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float, uint16_t* C,
                 const float* bias) {
  return gemm(p, t, s, A, B, C, bias);
}

// oneDNN's slices are rows: each call packs its op(B) for its kernel, and a slice of columns packs
// a narrow B whose kernel ran at 0.6-0.8 of the whole product's rate on AMX (a 1024 x 384 x 1152
// product at 2 threads: 1,160-1,250 GFLOP/s in columns, 1,630-1,760 in rows, 1,670-1,740 whole on
// oneDNN's own two threads; bench/RESULTS.md, "gemm"). Other paths: the longer side.
bool slice_rows(GemmPath p, const GemmShape& s) { return p == GemmPath::kOneDnn || s.M > s.N; }

template <class Out>
Status sliced(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, Out* C,
              const float* bias) {
  const size_t esize = t == GemmType::kBF16 ? 2 : 4;
  const auto* a = static_cast<const char*>(A);
  const auto* b = static_cast<const char*>(B);
  const bool by_rows = slice_rows(p, s);
  const int64_t extent = by_rows ? s.M : s.N;
  // The attention's blocks (64 x 256 x 64, thousands a step, heads already spread over the
  // workers) stay whole: below 2^24 multiply-adds a second slice costs more than it gives.
  const bool large = int64_t{s.M} * s.N * s.K >= (int64_t{1} << 24);
  const int64_t kSlice = slice_width(extent, p == GemmPath::kOneDnn && large);
  std::mutex mu;
  Status first;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, (extent + kSlice - 1) / kSlice, 1),
                    [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t k = r.begin(); k < r.end(); ++k) {
      const int64_t i0 = k * kSlice, n = std::min<int64_t>(extent - i0, kSlice);
      GemmShape g = s;
      const char* ga = a;
      const char* gb = b;
      Out* gc;
      const float* gbias = bias;
      if (by_rows) {  // rows i0.. of op(A) and of C
        g.M = static_cast<int>(n);
        ga += (s.ta ? i0 : i0 * s.lda) * esize;
        gc = C + i0 * s.ldc;
      } else {  // columns i0.. of op(B) and of C
        g.N = static_cast<int>(n);
        gb += (s.tb ? i0 * s.ldb : i0) * esize;
        gc = C + i0;
        if (bias) gbias = bias + i0;
      }
      Status st = gemm_into(p, t, g, ga, gb, beta, gc, gbias);
      if (st.ok()) continue;
      (void)gemm_into(GemmPath::kOpenBlas, t, g, ga, gb, beta, gc, gbias);
      std::lock_guard<std::mutex> l(mu);
      if (first.ok()) first = st;
    }
  });
  return first;
}

}  // namespace

Status gemm_threaded(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, float* C,
                     int threads) {
  if (p == GemmPath::kOneDnn && gemm_supported(p, t) && s.M > 0 && s.N > 0)
    return onednn::matmul(t == GemmType::kBF16, s, A, B, beta, C, false, nullptr, threads);
  if (p != GemmPath::kOpenBlas || t != GemmType::kF32) return gemm(p, t, s, A, B, beta, C);
  openblas(s, static_cast<const float*>(A), s.lda, static_cast<const float*>(B), s.ldb, beta, C, std::max(1, threads));
  return Status::Ok();
}

Status gemm_sliced(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, float beta, float* C,
                   const float* bias) {
  return sliced(p, t, s, A, B, beta, C, bias);
}

Status gemm_sliced(GemmPath p, GemmType t, const GemmShape& s, const void* A, const void* B, uint16_t* C,
                   const float* bias) {
  return sliced(p, t, s, A, B, 0.f, C, bias);
}

}  // namespace zoe

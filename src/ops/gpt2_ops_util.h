// Internal helpers of the gpt2 ops: TBB loops with fixed, thread-count independent partitions.
#pragma once
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "zoe/dtype.h"

namespace zoe::gpt2::detail {

// Calls f(begin, end) on disjoint pieces of [0, n), each of at least `grain` items.
template <class F>
void parallel_range(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, std::max<int64_t>(grain, 1)),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); });
}

// Rows per task so that one task touches about 16K floats: enough work to beat the
// scheduling cost, small enough to spread N=B*T rows over the cores.
inline int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_len, 1));
}

// Reductions over rows (dw/db of layernorm) use chunks of a size that depends only on the row
// count, and sum the per-chunk partials in chunk order: the result is bitwise the same for any
// number of threads, so ranks and reruns agree.
constexpr int64_t kReduceChunkRows = 64;
inline int64_t num_reduce_chunks(int64_t n) { return (n + kReduceChunkRows - 1) / kReduceChunkRows; }

// ---- 8-float vectors ----------------------------------------------------------------------
// GCC vector extension: compiled to AVX where the function targets it, to SSE pairs otherwise.
// Used where the auto-vectorizer gives up: exp (its range clamp is a select, which GCC turns
// into branches under the default -ftrapping-math) and the attention tiles.
// Kernels that use them are cloned for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and a
// baseline, picked at load time (ifunc), so the binary runs on any x86-64 and the AVX paths get
// FMAs (the v4 clone: the same 8-float operations with AVX-512's 32 registers and masked tails;
// GELU's forward 15 % faster on AMX, the step's losses bitwise the v3 clone's). Their helpers
// are always inlined so that they are compiled inside each clone.
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#pragma GCC diagnostic ignored "-Wpsabi"  // v8f never crosses a call: every helper is inlined

#define ZOE_INLINE inline __attribute__((always_inline))
// clang checks the vector ABI of a call before inlining it, and rejects the AVX clone's calls
// into these baseline helpers; clang builds (the sanitizer build) use the baseline kernels only.
#if defined(__x86_64__) && !defined(__clang__)
#define ZOE_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZOE_SIMD_CLONES
#endif

ZOE_INLINE v8f bcast(float s) { return v8f{} + s; }
ZOE_INLINE v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
ZOE_INLINE void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
// The first n < 8 floats; the other lanes are 0.
ZOE_INLINE v8f load8n(const float* p, int64_t n) {
  v8f v = {};
  std::memcpy(&v, p, n * sizeof(float));
  return v;
}
ZOE_INLINE void store8n(float* p, v8f v, int64_t n) { std::memcpy(p, &v, n * sizeof(float)); }
ZOE_INLINE float hsum(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
ZOE_INLINE float hmax(v8f v) {
  float m = v[0];
  for (int k = 1; k < 8; k++) m = std::max(m, v[k]);
  return m;
}

// e^x, relative error under 3e-7 for x in [-87, 88]; x outside is clamped to that range.
// Cephes expf: x = n ln2 + r, e^r by a polynomial, 2^n put into the exponent bits. V: 8 or 16
// floats (I: as many int32), each lane computed by the same operations whatever the width.
template <class V, class I>
ZOE_INLINE V exp_lanes(V x) {
  const V lo = V{} - 87.f, hi = V{} + 88.f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const V t = x * 1.44269504f + 12582912.f;  // 1.5*2^23: t's low bits hold round(x/ln2)
  const V n = t - 12582912.f;
  const V r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 in two parts
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const I e = (std::bit_cast<I>(t) - 0x4B400000 + 127) << 23;
  return p * std::bit_cast<V>(e);
}
ZOE_INLINE v8f exp8(v8f x) { return exp_lanes<v8f, v8i>(x); }

// tanh(x) = 1 - 2 / (e^{2x} + 1): absolute error about 1e-7, saturates cleanly to +-1.
template <class V, class I>
ZOE_INLINE V tanh_lanes(V x) { return 1.f - 2.f / (exp_lanes<V, I>(2.f * x) + 1.f); }
ZOE_INLINE v8f tanh8(v8f x) { return tanh_lanes<v8f, v8i>(x); }

// 16 floats: the elementwise kernels' main loops where the CPU has AVX-512 (the v4 clone: one
// register; two or four elsewhere, the same bits).
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
ZOE_INLINE v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
ZOE_INLINE void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof v); }
ZOE_INLINE v16f exp16(v16f x) { return exp_lanes<v16f, v16i>(x); }
ZOE_INLINE v8f lo8(v16f x) { return __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7); }
ZOE_INLINE v8f hi8(v16f x) { return __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15); }

// max of x[0, n), n >= 1.
ZOE_INLINE float max_of(const float* x, int64_t n) {
  v8f m = bcast(x[0]);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const v8f v = load8(x + j);
    m = v > m ? v : m;
  }
  float r = hmax(m);
  for (; j < n; j++) r = std::max(r, x[j]);
  return r;
}

// bf16 bit patterns of 8 floats, rounded to nearest even, NaN kept quiet: f32_to_bf16
// (zoe/dtype.h) lane by lane, branch-free so that it vectorises.
// H, U: the bit patterns' and uint32's vectors of F's width.
template <class H, class U, class F>
ZOE_INLINE H bf16_lanes(F x) {
  const U u = std::bit_cast<U>(x);
  const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U quiet = (u >> 16) | 0x40u;
  return __builtin_convertvector((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded, H);
}
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
ZOE_INLINE v8h bf16x8(v8f x) { return bf16_lanes<v8h, v8u>(x); }

// The same on 16 lanes (one AVX-512 register in the v4 clone), lane by lane the same bits.
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
ZOE_INLINE v16h bf16x16(v16f x) { return bf16_lanes<v16h, v16u>(x); }
// 16 bf16 bit patterns widened to fp32 (exact: the bits shifted into the high half).
ZOE_INLINE v16f widen16(const uint16_t* p) {
  v16h h;
  std::memcpy(&h, p, sizeof h);
  return std::bit_cast<v16f>(__builtin_convertvector(h, v16u) << 16);
}
// dst[0, n) = src widened to fp32 (exact).
ZOE_INLINE void widen_range(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16(dst + i, widen16(src + i));
  for (; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

// y[j] = e^(x[j] - shift) for j < n (y may alias x, or be null); returns their sum, in a fixed
// order.
ZOE_INLINE float exp_shift_sum(float* y, const float* x, float shift, int64_t n) {
  v8f acc = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const v8f e = exp8(load8(x + j) - shift);
    if (y) store8(y + j, e);
    acc += e;
  }
  if (j < n) {
    v8f e = exp8(load8n(x + j, n - j) - shift);
    if (y) store8n(y + j, e, n - j);
    for (int64_t k = n - j; k < 8; k++) e[k] = 0.f;
    acc += e;
  }
  return hsum(acc);
}

// dst[0, n) = src rounded to bf16 on the calling thread (round_to_bf16 without the tasks).
void round_range(uint16_t* dst, const float* src, int64_t n);
constexpr bool kNoTrans = false, kTrans = true;  // op(X) = X, X^T
// C[M, N] = op(A) op(B) + beta C on bf16 operands (bit patterns), fp32 out, through the model's
// bf16 GEMM path (gpt2_ops_matmul.cc: the path kernels/gemm.h picks, sliced over oneTBB).
void bgemm(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta,
           float* C, int ldc);

}  // namespace zoe::gpt2::detail

// AVX2 + FMA + F16C Adam kernel: 8 elements per vector, the operation order of adam_kernels.h.
// This file is compiled with -mavx2 -mfma -mf16c: everything in it but the entry point has
// internal linkage (half_avx2.h's helpers too), and it calls no inline function of a shared
// header, so no AVX2 code can be picked by the linker for a caller on an older CPU.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/adam_kernels.h"
#include "kernels/half_avx2.h"

namespace zoe {
namespace {

constexpr size_t kLanes = 8;
enum class Out { kNone, kF32, kBF16, kF16 };  // the weight copy written, if any

template <DType G> constexpr size_t kGradBytes = G == DType::kF32 ? 4 : 2;
template <Out P> constexpr size_t kOutBytes = P == Out::kF32 ? 4 : P == Out::kNone ? 0 : 2;

template <DType G>
inline __m256 load_grad(const void* grad, size_t i) {
  if constexpr (G == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
  if constexpr (G == DType::kBF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

// `stream`: non-temporal store (see kStreamCopyMinElems); the address is then aligned.
template <Out P>
inline void store_out(void* out, size_t i, __m256 p, bool stream) {
  if constexpr (P == Out::kF32) {
    float* dst = static_cast<float*>(out) + i;
    if (stream) _mm256_stream_ps(dst, p);
    else _mm256_storeu_ps(dst, p);
  }
  if constexpr (P == Out::kBF16 || P == Out::kF16) {
    __m128i* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i);
    const __m128i h = P == Out::kBF16 ? to_bf16(p) : to_f16(p);
    if (stream) _mm_stream_si128(dst, h);
    else _mm_storeu_si128(dst, h);
  }
}

// Rare path: some lanes were not finite; write the weight copy of the finite lanes only.
template <Out P>
inline void store_out_lanes(void* out, size_t i, __m256 p, int finite_bits) {
  alignas(32) uint8_t lanes[kLanes * 4];
  store_out<P>(lanes, 0, p, false);
  constexpr size_t w = kOutBytes<P>;
  for (size_t l = 0; l < kLanes; ++l)
    if (finite_bits & (1 << l)) std::memcpy(static_cast<uint8_t*>(out) + (i + l) * w, lanes + l * w, w);
}

// Elements [0, n) with n a multiple of kLanes. Returns the count of non-finite lanes.
template <DType G, Out P>
size_t adam_body(const AdamConsts& c, const void* grad, float* master, float* m, float* v, void* out,
                 size_t n) {
  const __m256 scale = _mm256_set1_ps(c.grad_scale), l2 = _mm256_set1_ps(c.l2);
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 beta1 = _mm256_set1_ps(c.beta1), omb1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2), omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 neg_step = _mm256_set1_ps(c.neg_step_size), isb2 = _mm256_set1_ps(c.inv_sqrt_bc2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  const bool stream = P != Out::kNone && n >= kStreamCopyMinElems && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  size_t nonfinite = 0;
  for (size_t i = 0; i < n; i += kLanes) {
    __m256 g = _mm256_mul_ps(load_grad<G>(grad, i), scale);
    const __m256 p0 = _mm256_loadu_ps(master + i);
    const __m256 m0 = _mm256_loadu_ps(m + i);
    const __m256 v0 = _mm256_loadu_ps(v + i);
    const __m256 finite = _mm256_cmp_ps(_mm256_and_ps(g, abs_mask), inf, _CMP_LT_OQ);  // NaN: false
    if (c.l2 != 0.0f) g = _mm256_fmadd_ps(l2, p0, g);  // loop-invariant branch
    __m256 p = _mm256_mul_ps(p0, decay);
    __m256 mn = _mm256_fmadd_ps(beta1, m0, _mm256_mul_ps(omb1, g));
    __m256 vn = _mm256_fmadd_ps(beta2, v0, _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vn), isb2, eps);
    p = _mm256_fmadd_ps(neg_step, _mm256_div_ps(mn, denom), p);
    // Non-finite lanes write back what they read: their state stays bit for bit.
    p = _mm256_blendv_ps(p0, p, finite);
    mn = _mm256_blendv_ps(m0, mn, finite);
    vn = _mm256_blendv_ps(v0, vn, finite);
    _mm256_storeu_ps(master + i, p);
    _mm256_storeu_ps(m + i, mn);
    _mm256_storeu_ps(v + i, vn);
    const int finite_bits = _mm256_movemask_ps(finite);
    if (__builtin_expect(finite_bits == 0xff, 1)) {
      store_out<P>(out, i, p, stream);
    } else {
      nonfinite += kLanes - static_cast<size_t>(__builtin_popcount(finite_bits));
      if constexpr (P != Out::kNone) store_out_lanes<P>(out, i, p, finite_bits);
    }
  }
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: visible before we return
  return nonfinite;
}

// The whole range: the body, then the last n % 8 elements through the same vector code on
// zero-padded copies (a zero gradient is finite, and padding lanes are never written back).
template <DType G, Out P>
size_t adam_range(const AdamConsts& c, const AdamRange& r) {
  const size_t body = r.n - r.n % kLanes, tail = r.n - body;
  size_t nonfinite = adam_body<G, P>(c, r.grad, r.master, r.exp_avg, r.exp_avg_sq, r.param_out, body);
  if (tail == 0) return nonfinite;
  constexpr size_t gw = kGradBytes<G>, ow = kOutBytes<P>;
  alignas(32) uint8_t grad[kLanes * 4] = {};
  alignas(32) float master[kLanes] = {}, m[kLanes] = {}, v[kLanes] = {};
  alignas(32) uint8_t out[kLanes * 4] = {};
  std::memcpy(grad, static_cast<const uint8_t*>(r.grad) + body * gw, tail * gw);
  std::memcpy(master, r.master + body, tail * 4);
  std::memcpy(m, r.exp_avg + body, tail * 4);
  std::memcpy(v, r.exp_avg_sq + body, tail * 4);
  uint8_t* out_tail = ow ? static_cast<uint8_t*>(r.param_out) + body * ow : nullptr;
  if (ow) std::memcpy(out, out_tail, tail * ow);  // kept as is where a lane is not finite
  nonfinite += adam_body<G, P>(c, grad, master, m, v, out, kLanes);
  std::memcpy(r.master + body, master, tail * 4);
  std::memcpy(r.exp_avg + body, m, tail * 4);
  std::memcpy(r.exp_avg_sq + body, v, tail * 4);
  if (ow) std::memcpy(out_tail, out, tail * ow);
  return nonfinite;
}

template <DType G>
size_t adam_range_out(const AdamConsts& c, const AdamRange& r) {
  if (!r.param_out) return adam_range<G, Out::kNone>(c, r);
  switch (r.param_dtype) {
    case DType::kF32: return adam_range<G, Out::kF32>(c, r);
    case DType::kBF16: return adam_range<G, Out::kBF16>(c, r);
    default: return adam_range<G, Out::kF16>(c, r);
  }
}

}  // namespace

size_t adam_range_avx2(const AdamConsts& c, const AdamRange& r) {
  switch (r.grad_dtype) {
    case DType::kF32: return adam_range_out<DType::kF32>(c, r);
    case DType::kBF16: return adam_range_out<DType::kBF16>(c, r);
    default: return adam_range_out<DType::kF16>(c, r);
  }
}

}  // namespace zoe

// AVX-512 Adam kernel: 16 elements per vector. It mirrors adam_avx2.cc line for line (same
// operation order, same FMAs, same conversions), so the two give bitwise-identical results.
// This file is compiled with -mavx512f/bw/vl/dq/bf16 -mfma -mf16c: everything in it but the entry
// point has internal linkage (half_avx512.h's helpers too), and it calls no inline function of a
// shared header, so no AVX-512 code can be picked by the linker for a caller on an older CPU.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() (GCC
// bug 105593); the warning is about the header, not this code.
#if !defined(__clang__)  // clang has no such warning, and warns about the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/adam_kernels.h"
#include "kernels/half_avx512.h"

namespace zoe {
namespace {

constexpr size_t kLanes = 16;
enum class Out { kNone, kF32, kBF16, kBF16Native, kF16 };  // the weight copy written, if any

template <DType G> constexpr size_t kGradBytes = G == DType::kF32 ? 4 : 2;
template <Out P> constexpr size_t kOutBytes = P == Out::kF32 ? 4 : P == Out::kNone ? 0 : 2;

template <DType G>
inline __m512 load_grad(const void* grad, size_t i) {
  if constexpr (G == DType::kF32) return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
  if constexpr (G == DType::kBF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

template <Out P>
inline __m256i to_half(__m512 p) {
  if constexpr (P == Out::kBF16) return to_bf16(p);
  if constexpr (P == Out::kBF16Native) return to_bf16_native(p);
  return to_f16(p);
}

// `stream`: non-temporal store (see kStreamCopyMinElems); the address is then aligned.
template <Out P>
inline void store_out(void* out, size_t i, __m512 p, bool stream) {
  if constexpr (P == Out::kF32) {
    float* dst = static_cast<float*>(out) + i;
    if (stream) _mm512_stream_ps(dst, p);
    else _mm512_storeu_ps(dst, p);
  }
  if constexpr (kOutBytes<P> == 2) {
    __m256i* dst = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i);
    const __m256i h = to_half<P>(p);
    if (stream) _mm256_stream_si256(dst, h);
    else _mm256_storeu_si256(dst, h);
  }
}

// Rare path: some lanes were not finite; write the weight copy of the finite lanes only.
template <Out P>
inline void store_out_lanes(void* out, size_t i, __m512 p, __mmask16 finite) {
  if constexpr (P == Out::kF32) _mm512_mask_storeu_ps(static_cast<float*>(out) + i, finite, p);
  if constexpr (kOutBytes<P> == 2) _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + i, finite, to_half<P>(p));
}

// Elements [0, n) with n a multiple of kLanes. Returns the count of non-finite lanes.
template <DType G, Out P>
size_t adam_body(const AdamConsts& c, const void* grad, float* master, float* m, float* v, void* out,
                 size_t n) {
  const __m512 scale = _mm512_set1_ps(c.grad_scale), l2 = _mm512_set1_ps(c.l2);
  const __m512 decay = _mm512_set1_ps(c.decay);
  const __m512 beta1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 neg_step = _mm512_set1_ps(c.neg_step_size), isb2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  const bool stream = P != Out::kNone && n >= kStreamCopyMinElems && (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  size_t nonfinite = 0;
  for (size_t i = 0; i < n; i += kLanes) {
    __m512 g = _mm512_mul_ps(load_grad<G>(grad, i), scale);
    const __m512 p0 = _mm512_loadu_ps(master + i);
    const __m512 m0 = _mm512_loadu_ps(m + i);
    const __m512 v0 = _mm512_loadu_ps(v + i);
    const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(g), inf, _CMP_LT_OQ);  // NaN: false
    if (c.l2 != 0.0f) g = _mm512_fmadd_ps(l2, p0, g);  // loop-invariant branch
    __m512 p = _mm512_mul_ps(p0, decay);
    __m512 mn = _mm512_fmadd_ps(beta1, m0, _mm512_mul_ps(omb1, g));
    __m512 vn = _mm512_fmadd_ps(beta2, v0, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vn), isb2, eps);
    p = _mm512_fmadd_ps(neg_step, _mm512_div_ps(mn, denom), p);
    // Non-finite lanes write back what they read: their state stays bit for bit.
    p = _mm512_mask_blend_ps(finite, p0, p);
    mn = _mm512_mask_blend_ps(finite, m0, mn);
    vn = _mm512_mask_blend_ps(finite, v0, vn);
    _mm512_storeu_ps(master + i, p);
    _mm512_storeu_ps(m + i, mn);
    _mm512_storeu_ps(v + i, vn);
    if (__builtin_expect(finite == 0xffff, 1)) {
      store_out<P>(out, i, p, stream);
    } else {
      nonfinite += kLanes - static_cast<size_t>(__builtin_popcount(finite));
      if constexpr (P != Out::kNone) store_out_lanes<P>(out, i, p, finite);
    }
  }
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: visible before we return
  return nonfinite;
}

// The whole range: the body, then the last n % 16 elements through the same vector code on
// zero-padded copies (a zero gradient is finite, and padding lanes are never written back).
template <DType G, Out P>
size_t adam_range(const AdamConsts& c, const AdamRange& r) {
  const size_t body = r.n - r.n % kLanes, tail = r.n - body;
  size_t nonfinite = adam_body<G, P>(c, r.grad, r.master, r.exp_avg, r.exp_avg_sq, r.param_out, body);
  if (tail == 0) return nonfinite;
  constexpr size_t gw = kGradBytes<G>, ow = kOutBytes<P>;
  alignas(64) uint8_t grad[kLanes * 4] = {};
  alignas(64) float master[kLanes] = {}, m[kLanes] = {}, v[kLanes] = {};
  alignas(64) uint8_t out[kLanes * 4] = {};
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
size_t adam_range_out(const AdamConsts& c, const AdamRange& r, bool native_bf16) {
  if (!r.param_out) return adam_range<G, Out::kNone>(c, r);
  switch (r.param_dtype) {
    case DType::kF32: return adam_range<G, Out::kF32>(c, r);
    case DType::kBF16:
      return native_bf16 ? adam_range<G, Out::kBF16Native>(c, r) : adam_range<G, Out::kBF16>(c, r);
    default: return adam_range<G, Out::kF16>(c, r);
  }
}

}  // namespace

size_t adam_range_avx512(const AdamConsts& c, const AdamRange& r, bool native_bf16) {
  switch (r.grad_dtype) {
    case DType::kF32: return adam_range_out<DType::kF32>(c, r, native_bf16);
    case DType::kBF16: return adam_range_out<DType::kBF16>(c, r, native_bf16);
    default: return adam_range_out<DType::kF16>(c, r, native_bf16);
  }
}

}  // namespace zoe

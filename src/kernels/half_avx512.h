// fp32 -> bf16 / fp16 in AVX-512 registers, bitwise dtype.h's f32_to_bf16 / f32_to_f16 on every
// input. For files compiled with AVX-512 (and -mavx512bf16 -mf16c) only: every helper is static
// (internal linkage), so no copy of one is ever picked by the linker for another file.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace zoe {

// fp32 -> bf16, round to nearest even; NaN -> its top half with the quiet bit set (as dtype.h).
static inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));  // exact: fits 16 bits
}

// The same with AVX512-BF16's vcvtneps2bf16, which rounds to nearest even and quiets NaNs the
// same way but flushes fp32 subnormals to a signed zero: such lanes (a rare branch) take the
// integer path, so the result equals to_bf16 on every input.
static inline __m256i to_bf16_native(__m512 x) {
  const __m512i abs = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nonzero = _mm512_test_epi32_mask(abs, abs);
  const __mmask16 subnormal = _mm512_mask_cmplt_epi32_mask(nonzero, abs, _mm512_set1_epi32(0x00800000));
  if (__builtin_expect(subnormal != 0, 0)) return to_bf16(x);
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
}

// fp32 -> fp16, round to nearest even. The instruction keeps a NaN's payload; dtype.h makes every
// NaN sign|0x7e00, so NaN lanes (never seen in a healthy run: a rare branch) are rewritten.
static inline __m256i to_f16(__m512 x) {
  __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  if (__builtin_expect(nan != 0, 0)) {
    const __m256i fixed = _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(int16_t(0x8000))), _mm256_set1_epi16(0x7e00));
    h = _mm256_mask_blend_epi16(nan, h, fixed);
  }
  return h;
}

}  // namespace zoe

// fp32 -> bf16 / fp16 in AVX2 registers (F16C for fp16), bitwise dtype.h's f32_to_bf16 /
// f32_to_f16 on every input. For files compiled with -mavx2 -mf16c only: every helper is static
// (internal linkage), so no copy of one is ever picked by the linker for another file.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace zoe {

// fp32 -> bf16, round to nearest even; NaN -> its top half with the quiet bit set (as dtype.h).
static inline __m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // Values fit 16 bits, so the saturating pack is exact; it packs within 128-bit lanes.
  const __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// fp32 -> fp16 with F16C, round to nearest even. F16C keeps a NaN's payload; dtype.h makes every
// NaN sign|0x7e00, so NaN lanes (never seen in a healthy run: a rare branch) are rewritten.
static inline __m128i to_f16(__m256 x) {
  __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
    const __m128i fixed = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(int16_t(0x8000))), _mm_set1_epi16(0x7e00));
    const __m256i nan32 = _mm256_castps_si256(nan);
    const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    h = _mm_blendv_epi8(h, fixed, nan16);
  }
  return h;
}

}  // namespace zoe

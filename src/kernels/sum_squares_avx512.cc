// The AVX-512 sums of squares (see sum_squares.h): the eight running sums are the eight lanes of
// one register, so the order of every add is the scalar reference's. Compiled with
// -ffp-contract=off: a fused multiply-add would round once where the reference rounds twice.
#include <immintrin.h>

#include <cstdint>

#include "kernels/sum_squares.h"

namespace zoe {

namespace {

// Eight floats as doubles (exact). The all-ones zero-masking form: GCC 12 warns that the plain
// _mm512_cvtps_pd's undefined pass-through may be used uninitialized.
inline __m512d widen(__m256 f) { return _mm512_maskz_cvtps_pd(0xFF, f); }

// Eight elements from p, as doubles (every conversion here is exact).
inline __m512d load8(const float* p) { return widen(_mm256_loadu_ps(p)); }
inline __m512d load8_bf16(const uint16_t* p) {
  const __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return widen(_mm256_castsi256_ps(_mm256_slli_epi32(widened, 16)));
}
inline __m512d load8_f16(const uint16_t* p) {
  return widen(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <typename T, typename Load8>
double eight_lanes(const T* x, size_t lo, size_t hi, Load8 load8_at, DType dt) {
  __m512d acc = _mm512_setzero_pd();
  size_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    const __m512d v = load8_at(x + i);
    acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
  }
  alignas(64) double s[8];
  _mm512_store_pd(s, acc);
  for (size_t j = 0; i < hi; ++i, ++j) {  // the tail, lane by lane as the reference does it
    double v = 0;
    if constexpr (sizeof(T) == 4) v = x[i];
    else v = dt == DType::kBF16 ? bf16_to_f32(x[i]) : f16_to_f32(x[i]);
    s[j] += v * v;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

double sum_squares_avx512(DType dt, const void* x, size_t lo, size_t hi) {
  switch (dt) {
    case DType::kF32: return eight_lanes(static_cast<const float*>(x), lo, hi, [](const float* p) { return load8(p); }, dt);
    case DType::kBF16:
      return eight_lanes(static_cast<const uint16_t*>(x), lo, hi, [](const uint16_t* p) { return load8_bf16(p); }, dt);
    case DType::kF16:
      return eight_lanes(static_cast<const uint16_t*>(x), lo, hi, [](const uint16_t* p) { return load8_f16(p); }, dt);
  }
  return 0;
}

}  // namespace zoe

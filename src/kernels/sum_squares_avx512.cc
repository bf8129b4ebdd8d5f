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

// The elements of p that mask m names, as doubles (exact); the other lanes are +0.
inline __m512d load8(const float* p, __mmask8 m) { return widen(_mm256_maskz_loadu_ps(m, p)); }
inline __m256i load8_16(const uint16_t* p, __mmask8 m) { return _mm256_cvtepu16_epi32(_mm_maskz_loadu_epi16(m, p)); }
inline __m512d load8_bf16(const uint16_t* p, __mmask8 m) {
  return widen(_mm256_castsi256_ps(_mm256_slli_epi32(load8_16(p, m), 16)));
}
inline __m512d load8_f16(const uint16_t* p, __mmask8 m) {
  return widen(_mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, p)));
}

// The tail's element j goes into lane j, as in the reference; the lanes past it add 0 * 0, which
// leaves a sum of squares (+0 or more, or NaN) bitwise as it was.
template <typename T, typename Load8>
double eight_lanes(const T* x, size_t lo, size_t hi, Load8 load8_at) {
  __m512d acc = _mm512_setzero_pd();
  for (size_t i = lo; i < hi; i += 8) {
    const __mmask8 m = hi - i >= 8 ? __mmask8{0xFF} : static_cast<__mmask8>((1u << (hi - i)) - 1);
    const __m512d v = load8_at(x + i, m);
    acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
  }
  alignas(64) double s[8];
  _mm512_store_pd(s, acc);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

double sum_squares_avx512(DType dt, const void* x, size_t lo, size_t hi) {
  switch (dt) {
    case DType::kF32: return eight_lanes(static_cast<const float*>(x), lo, hi, load8);
    case DType::kBF16: return eight_lanes(static_cast<const uint16_t*>(x), lo, hi, load8_bf16);
    case DType::kF16: return eight_lanes(static_cast<const uint16_t*>(x), lo, hi, load8_f16);
  }
  return 0;
}

}  // namespace zoe

// The scalar reference of the sums of squares (see sum_squares.h) and the ISA choice.
#include "kernels/sum_squares.h"

#include <cstdint>

namespace zoe {

namespace {

template <typename Load>
double eight_sums(Load load, size_t lo, size_t hi) {
  double s[8] = {};
  size_t i = lo;
  for (; i + 8 <= hi; i += 8)
    for (size_t j = 0; j < 8; ++j) {
      const double v = load(i + j);
      s[j] += v * v;
    }
  for (size_t j = 0; i < hi; ++i, ++j) {
    const double v = load(i);
    s[j] += v * v;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

double sum_squares_scalar(DType dt, const void* x, size_t lo, size_t hi) {
  switch (dt) {
    case DType::kF32: {
      const float* p = static_cast<const float*>(x);
      return eight_sums([p](size_t i) { return p[i]; }, lo, hi);
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(x);
      return eight_sums([p](size_t i) { return bf16_to_f32(p[i]); }, lo, hi);
    }
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(x);
      return eight_sums([p](size_t i) { return f16_to_f32(p[i]); }, lo, hi);
    }
  }
  return 0;
}

double sum_squares_range(DType dt, const void* x, size_t lo, size_t hi, Isa isa) {
  if (isa == Isa::kAvx512 && isa_supported(Isa::kAvx512)) return sum_squares_avx512(dt, x, lo, hi);
  return sum_squares_scalar(dt, x, lo, hi);
}

}  // namespace zoe

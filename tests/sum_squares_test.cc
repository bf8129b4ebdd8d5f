// The gradient norm's sums of squares: the AVX-512 kernel is bitwise the scalar reference for
// every dtype, length, tail and start, and the reference is the float64 sum it claims to be.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/sum_squares.h"
#include "zoe/dtype.h"

namespace zoe {
namespace {

// Values over many binades (squares that differ by 1e20 make any reordering of the adds visible).
std::vector<float> wide_values(size_t n, uint64_t seed, int span = 20) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-span, span);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
  return v;
}

std::vector<uint16_t> to_half_bits(const std::vector<float>& v, DType dt) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = dt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return h;
}

uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

TEST(SumSquares, Avx512IsBitwiseTheScalarReference) {
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "avx512 path not tested: this CPU lacks the ISA";
  const std::vector<float> f = wide_values(70000, 1);
  const std::vector<uint16_t> bf = to_half_bits(f, DType::kBF16);
  const std::vector<uint16_t> hf = to_half_bits(wide_values(70000, 3, 12), DType::kF16);  // finite in fp16
  const std::pair<size_t, size_t> ranges[] = {{0, 0}, {0, 1}, {0, 7}, {0, 8}, {0, 9}, {3, 20}, {5, 1000},
                                              {1, 65536 + 3}, {0, 70000}, {69990, 70000}};
  for (auto [lo, hi] : ranges)
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      const void* x = dt == DType::kF32 ? static_cast<const void*>(f.data())
                      : dt == DType::kBF16 ? static_cast<const void*>(bf.data())
                                           : static_cast<const void*>(hf.data());
      SCOPED_TRACE(std::string(dtype_name(dt)) + " [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
      const double ref = sum_squares_scalar(dt, x, lo, hi), fast = sum_squares_avx512(dt, x, lo, hi);
      EXPECT_EQ(bits(fast), bits(ref)) << fast << " vs " << ref;
      EXPECT_EQ(bits(sum_squares_range(dt, x, lo, hi, Isa::kAvx512)), bits(ref));
    }
}

TEST(SumSquares, TheReferenceIsTheFloat64SumAndKeepsInfinities) {
  const std::vector<float> f = wide_values(1001, 2);
  long double want = 0;
  for (float x : f) want += static_cast<long double>(x) * x;
  for (Isa isa : {Isa::kScalar, Isa::kAvx512}) {
    SCOPED_TRACE(isa_name(isa));
    const double got = sum_squares_range(DType::kF32, f.data(), 0, f.size(), isa);
    EXPECT_NEAR(got, static_cast<double>(want), 1e-14 * static_cast<double>(want));
    std::vector<float> g = f;
    g[500] = std::numeric_limits<float>::infinity();
    EXPECT_TRUE(std::isinf(sum_squares_range(DType::kF32, g.data(), 0, g.size(), isa)));
    g[500] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(sum_squares_range(DType::kF32, g.data(), 0, g.size(), isa)));
  }
}

}  // namespace
}  // namespace zoe

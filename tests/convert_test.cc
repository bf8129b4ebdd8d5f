// The fp32 -> bf16 / fp16 conversion of gradients into their shards: every ISA gives dtype.h's
// bits on every float class (ties, subnormals, infinities, NaNs), at every length, start and tail,
// and the CPU device's accumulate (the path the hand-over takes) gives the same.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/cpu_device.h"
#include "kernels/convert.h"
#include "zoe/dtype.h"

namespace zoe {
namespace {

// Random bit patterns (every class: NaNs with payloads, subnormals, infinities, both signs),
// the boundary cases one by one, and values exactly halfway between two bf16s (ties to even).
std::vector<float> every_class(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 65504.0f, 65520.0f,
                          6.0e-8f, 3.0e-8f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
  while (v.size() < n) {
    const uint32_t u = static_cast<uint32_t>(rng());
    switch (v.size() % 4) {
      case 0: v.push_back(std::bit_cast<float>(u)); break;                          // any pattern
      case 1: v.push_back(std::bit_cast<float>((u & 0x807fffffu)));  break;         // subnormal
      case 2: v.push_back(std::bit_cast<float>((u & 0xffff0000u) | 0x8000u)); break;  // a bf16 tie
      default: v.push_back(std::ldexp(static_cast<float>(u) / 4294967296.0f - 0.5f, static_cast<int>(u % 40) - 20));
    }
  }
  return v;
}

std::vector<uint16_t> reference(const std::vector<float>& v, DType dt) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = dt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return h;
}

TEST(Convert, EveryIsaGivesTheReferenceBitsOnEveryClass) {
  const std::vector<float> f = every_class(70001, 7);
  const std::pair<size_t, size_t> ranges[] = {{0, 0}, {0, 1}, {0, 15}, {0, 16}, {0, 17}, {3, 40}, {5, 1000}, {1, 70001}};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::vector<uint16_t> want = reference(f, dt);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
      for (auto [lo, hi] : ranges) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + isa_name(isa) + " [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + ")");
        std::vector<uint16_t> got(f.size(), 0x5555);
        convert_from_f32(dt, got.data(), f.data(), lo, hi, isa);
        for (size_t i = 0; i < f.size(); ++i) {
          const uint16_t expect = i >= lo && i < hi ? want[i] : uint16_t{0x5555};  // nothing outside the range
          ASSERT_EQ(got[i], expect) << "element " << i << " (0x" << std::hex << std::bit_cast<uint32_t>(f[i]) << ")";
        }
      }
  }
  std::printf("[ info ] convert: the scalar kernel, %s, %s checked\n",
              isa_supported(Isa::kAvx2) ? "avx2" : "not avx2 (absent here)",
              isa_supported(Isa::kAvx512) ? "avx512" : "not avx512 (absent here)");
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "the avx512 kernel did not run: this CPU lacks the ISA";
}

TEST(Convert, TheCpuDevicesHandOverConversionIsTheReference) {
  const std::vector<float> f = every_class(200003, 11);  // several of the device's parallel grains
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    CpuDevice dev(8 << 20, 8 << 20, /*strict=*/true);
    auto src = dev.alloc(f.size() * 4, Tier::kDevice, Kind::kStaging);
    auto dst = dev.alloc(f.size() * dtype_size(dt), Tier::kHost, Kind::kStaging);
    ASSERT_TRUE(src.ok() && dst.ok());
    ASSERT_TRUE(dev.upload(src->data, f.data(), f.size() * 4).ok());
    ASSERT_TRUE(dev.accumulate(dst->data, dt, src->data, DType::kF32, f.size(), false).ok());
    std::vector<uint8_t> got(f.size() * dtype_size(dt)), want(got.size());
    std::memcpy(got.data(), dst->data, got.size());  // host memory
    for (size_t i = 0; i < f.size(); ++i) store_from_f32(want.data(), dt, i, f[i]);
    EXPECT_TRUE(got == want) << dtype_name(dt);
    dev.free(*src);
    dev.free(*dst);
  }
}

// The CPU device's one pass (convert each block, sum it while in cache) against the base class's
// two calls: the same shard and the same sum, bit for bit, over lengths around its 64 Ki grid.
TEST(Convert, TheCpuDevicesFusedSumOfSquaresIsBitwiseTheTwoCalls) {
  const std::vector<float> f = every_class(200003, 13);
  std::vector<float> finite;  // a norm over NaNs is NaN either way: finite values tell more
  for (float x : f)
    if (std::isfinite(x)) finite.push_back(x);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
    for (size_t n : {size_t{0}, size_t{1}, size_t{65535}, size_t{65536}, size_t{65537}, finite.size()}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n));
      CpuDevice dev(16 << 20, 16 << 20, /*strict=*/true);
      auto src = dev.alloc(finite.size() * 4, Tier::kDevice, Kind::kStaging);
      auto one = dev.alloc(finite.size() * 4, Tier::kDevice, Kind::kStaging);
      auto two = dev.alloc(finite.size() * 4, Tier::kDevice, Kind::kStaging);
      auto sums = dev.alloc(2 * sizeof(double), Tier::kDevice, Kind::kStaging);
      ASSERT_TRUE(src.ok() && one.ok() && two.ok() && sums.ok());
      ASSERT_TRUE(dev.upload(src->data, finite.data(), finite.size() * 4).ok());
      double* s = sums->as<double>();
      const double start[2] = {0.25, 0.25};  // both add to what is there
      ASSERT_TRUE(dev.upload(s, start, sizeof(start)).ok());
      ASSERT_TRUE(dev.convert_sum_squares(one->data, dt, src->as<float>(), n, s).ok());
      ASSERT_TRUE(dev.Device::convert_sum_squares(two->data, dt, src->as<float>(), n, s + 1).ok());
      std::vector<uint8_t> a(n * dtype_size(dt)), b(a.size());
      double got[2];
      ASSERT_TRUE(dev.download(a.data(), one->data, a.size()).ok());
      ASSERT_TRUE(dev.download(b.data(), two->data, b.size()).ok());
      ASSERT_TRUE(dev.download(got, s, sizeof(got)).ok());
      EXPECT_TRUE(a == b);
      EXPECT_EQ(std::bit_cast<uint64_t>(got[0]), std::bit_cast<uint64_t>(got[1])) << got[0] << " vs " << got[1];
      for (auto* x : {&*src, &*one, &*two, &*sums}) dev.free(*x);
    }
}

}  // namespace
}  // namespace zoe

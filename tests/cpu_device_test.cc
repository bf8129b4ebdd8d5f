// The CPU device's contract as a GPU would hold it: strict mode makes device memory untouchable
// from host code outside Device calls and refuses kernel pointers a GPU could not reach; streams
// order copies, and wait_on orders one stream after another.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/adam.h"
#include "cpu/cpu_device.h"
#include "ops/model_ops.h"

namespace zoe {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(CpuDeviceDeathTest, StrictDeviceMemoryFaultsWhenHostCodeTouchesIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        CpuDevice dev(kMiB, kMiB, /*strict=*/true);
        Buffer b = dev.alloc(4096, Tier::kDevice, Kind::kStaging).value();
        static_cast<volatile float*>(b.data)[3] = 1.0f;  // host code, outside any Device call
      },
      "cpu-strict: host code touched device memory at 0x[0-9a-f]+ \\(offset 0x[0-9a-f]+ of the device arena\\)");
}

TEST(CpuDevice, StrictDeviceMovesDeviceMemoryOnlyThroughItsCalls) {
  CpuDevice dev(kMiB, kMiB, /*strict=*/true);
  Buffer b = dev.alloc(16, Tier::kDevice, Kind::kStaging).value();
  float in[4] = {1, 2, 3, 4}, out[4] = {};
  ASSERT_TRUE(dev.upload(b.data, in, sizeof(in)).ok());
  ASSERT_TRUE(dev.accumulate(b.data, DType::kF32, b.data, DType::kF32, 4, true).ok());  // doubles it
  ASSERT_TRUE(dev.download(out, b.data, sizeof(out)).ok());
  EXPECT_EQ(out[3], 8.0f);
  {  // the Comm paired with the device may touch it while it holds a HostAccess
    Device::HostAccess access(dev);
    EXPECT_EQ(static_cast<float*>(b.data)[0], 2.0f);
  }
  dev.free(b);
}

TEST(CpuDevice, StrictKernelsRefuseHostMemoryAGpuCouldNotReach) {
  CpuDevice dev(kMiB, kMiB, /*strict=*/true);
  Buffer d = dev.alloc(64, Tier::kDevice, Kind::kStaging).value();
  std::vector<float> plain(16, 1.0f);
  Status st = dev.accumulate(d.data, DType::kF32, plain.data(), DType::kF32, 16, false);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cpu-strict: accumulate source"), std::string::npos) << st.message();
  // Pinned (kHost) buffers and registered ranges are reachable, as they are from a GPU.
  Buffer h = dev.alloc(64, Tier::kHost, Kind::kStaging).value();
  EXPECT_TRUE(dev.accumulate(d.data, DType::kF32, h.data, DType::kF32, 16, false).ok());
  ASSERT_TRUE(dev.register_host(plain.data(), plain.size() * 4).ok());
  EXPECT_TRUE(dev.accumulate(d.data, DType::kF32, plain.data(), DType::kF32, 16, false).ok());
  dev.unregister_host(plain.data());
  EXPECT_FALSE(dev.accumulate(d.data, DType::kF32, plain.data(), DType::kF32, 16, false).ok());
  // Device-side results (the Adam counter) must be device memory too.
  uint64_t counter = 0;
  EXPECT_FALSE(dev.adam(AdamHyper{}, nullptr, 0, &counter).ok()) << "the counter must be device memory";
  dev.free(d);
  dev.free(h);
}

TEST(CpuDeviceDeathTest, StrictModelOpsStopOnAHostPointerNamingTheOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        CpuDevice dev(kMiB, kMiB, /*strict=*/true);
        std::vector<float> x(8);
        dev.ops().gelu_forward(x.data(), x.data(), 8);
      },
      "cpu-strict: gelu_forward at");
}

TEST(CpuDevice, PlainDeviceLetsHostCodeTouchItsMemory) {
  CpuDevice dev(kMiB, kMiB);
  Buffer b = dev.alloc(16, Tier::kDevice, Kind::kStaging).value();
  static_cast<float*>(b.data)[0] = 5.0f;
  std::vector<float> plain(4, 1.0f);
  EXPECT_TRUE(dev.accumulate(b.data, DType::kF32, plain.data(), DType::kF32, 4, true).ok());
  EXPECT_EQ(static_cast<float*>(b.data)[0], 6.0f);
  dev.free(b);
}

// A copy on the device-to-host stream that waits (wait_on) for one on the host-to-device stream
// sees its bytes, however the two worker threads are scheduled.
TEST(CpuDevice, WaitOnOrdersOneCopyStreamAfterAnother) {
  CpuDevice dev(64 * kMiB, 64 * kMiB, /*strict=*/true);
  const size_t n = 8 * kMiB;
  Buffer src = dev.alloc(n, Tier::kHost, Kind::kStaging).value();
  Buffer mid = dev.alloc(n, Tier::kDevice, Kind::kStaging).value();
  Buffer dst = dev.alloc(n, Tier::kHost, Kind::kStaging).value();
  for (int round = 0; round < 5; ++round) {
    std::memset(src.data, 'a' + round, n);
    std::memset(dst.data, 0, n);
    ASSERT_TRUE(dev.copy_async(mid, 0, src, 0, n, Stream::kH2D).ok());
    ASSERT_TRUE(dev.wait_on(Stream::kD2H, dev.record(Stream::kH2D)).ok());
    ASSERT_TRUE(dev.copy_async(dst, 0, mid, 0, n, Stream::kD2H).ok());
    ASSERT_TRUE(dev.wait(dev.record(Stream::kD2H)).ok());
    EXPECT_EQ(static_cast<char*>(dst.data)[n - 1], 'a' + round);
    EXPECT_EQ(static_cast<char*>(dst.data)[0], 'a' + round);
  }
  for (Buffer* b : {&src, &mid, &dst}) dev.free(*b);
}

TEST(CpuDevice, SumSquaresAddsEverySpanIntoADeviceDouble) {
  CpuDevice dev(kMiB, kMiB, /*strict=*/true);
  std::vector<float> a(70000), b(3);
  double want = 0;
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.001f * static_cast<float>(i % 97), want += double(a[i]) * a[i];
  for (size_t i = 0; i < b.size(); ++i) b[i] = 2.0f, want += 4.0;
  Buffer da = dev.alloc(a.size() * 4, Tier::kDevice, Kind::kStaging).value();
  Buffer db = dev.alloc(b.size() * 4, Tier::kDevice, Kind::kStaging).value();
  Buffer out = dev.alloc(8, Tier::kDevice, Kind::kStaging).value();
  ASSERT_TRUE(dev.upload(da.data, a.data(), a.size() * 4).ok());
  ASSERT_TRUE(dev.upload(db.data, b.data(), b.size() * 4).ok());
  ASSERT_TRUE(dev.zero(out.data, 8).ok());
  ArrayView spans[] = {{da.data, DType::kF32, a.size()}, {db.data, DType::kF32, b.size()}};
  ASSERT_TRUE(dev.sum_squares(spans, 2, out.as<double>()).ok());
  double got = 0;
  ASSERT_TRUE(dev.download(&got, out.data, 8).ok());
  EXPECT_NEAR(got, want, 1e-9 * want);
  for (Buffer* x : {&da, &db, &out}) dev.free(*x);
}

// Each dtype's loop against a float64 sum of the same stored values, over several 64 Ki blocks
// and a ragged end.
TEST(CpuDevice, SumSquaresOfEveryDtypeMatchesAFloat64Sum) {
  CpuDevice dev(kMiB, kMiB, /*strict=*/true);
  const size_t n = 200003;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> host(n * dtype_size(dt));
    double want = 0;
    for (size_t i = 0; i < n; ++i) {
      store_from_f32(host.data(), dt, i, 0.01f * static_cast<float>(i % 101) - 0.5f);
      const double v = load_as_f32(host.data(), dt, i);
      want += v * v;
    }
    Buffer x = dev.alloc(host.size(), Tier::kDevice, Kind::kStaging).value();
    Buffer out = dev.alloc(8, Tier::kDevice, Kind::kStaging).value();
    ASSERT_TRUE(dev.upload(x.data, host.data(), host.size()).ok());
    ASSERT_TRUE(dev.zero(out.data, 8).ok());
    ArrayView span{x.data, dt, n};
    ASSERT_TRUE(dev.sum_squares(&span, 1, out.as<double>()).ok());
    double got = 0;
    ASSERT_TRUE(dev.download(&got, out.data, 8).ok());
    EXPECT_NEAR(got, want, 1e-12 * want) << dtype_name(dt);
    for (Buffer* b : {&x, &out}) dev.free(*b);
  }
}

}  // namespace
}  // namespace zoe

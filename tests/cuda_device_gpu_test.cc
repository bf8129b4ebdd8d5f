// CudaDevice on a real GPU: copies between every kind of memory, stream order (wait_on, and
// upload/download waiting for the compute stream), events, the kernels against the CPU's
// (accumulate and sum_chunks bit for bit, NaNs, infinities, subnormals and rounding ties
// included; sum_squares against a float64 host sum and against itself; Adam over many ranges
// with and without weight decay bit for bit), the budgets and the ledger. Skips where there is
// no CUDA build or no GPU; the missing-GPU error is checked everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "kernels/adam.h"
#include "test_util.h"
#include "zoe/device.h"
#include "zoe/dtype.h"

#ifdef ZOE_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/cuda_model_ops.h"
#include "gpu/gpu_info.h"
#include "nvme/nvme_store.h"
#include "ops/gpt2_ops.h"
#include "nvme/pinned_pool.h"
#include "sched/stage3/chunk_load.h"
#include "sched/stage3/window_retirement.h"
#include "sched/state_array.h"

namespace zoe {
namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

// --- element generation ----------------------------------------------------------------------

// Raw bit patterns of special values per dtype: NaNs (quiet, signalling, negative, with
// payloads), infinities, zeros, subnormals, the largest finite values and rounding ties of the
// narrower types.
std::vector<uint32_t> specials(DType t) {
  switch (t) {
    case DType::kF32:
      return {0x7fc00000u, 0x7fa00001u, 0xffc12345u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000000u,
              0x80000000u, 0x00000001u, 0x807fffffu, 0x477ff000u, 0x477fefffu, 0xc77ff000u, 0x33000000u,
              0x33000001u, 0x38800000u, 0x387fc000u, 0x387ff000u, 0x7f7fffffu, 0x3f808000u, 0x3f818000u,
              0x3f800001u, 0xb3800000u, 0x00800000u};
    case DType::kBF16:
      return {0x7fc0u, 0x7f81u, 0xffc1u, 0x7f80u, 0xff80u, 0x0000u, 0x8000u, 0x0001u, 0x807fu, 0x7f7fu, 0xff7fu,
              0x3f81u, 0x0080u};
    default:
      return {0x7e00u, 0x7c01u, 0xfe01u, 0x7d55u, 0x7c00u, 0xfc00u, 0x0000u, 0x8000u, 0x0001u, 0x03ffu, 0x8001u,
              0x7bffu, 0xfbffu, 0x0400u, 0x3c01u};
  }
}

void set_bits(std::vector<uint8_t>& bytes, DType t, size_t i, uint32_t bits) {
  if (t == DType::kF32) {
    std::memcpy(bytes.data() + 4 * i, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
}

uint32_t get_bits(const void* p, DType t, size_t i) {
  if (t == DType::kF32) {
    uint32_t u;
    std::memcpy(&u, static_cast<const char*>(p) + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
  return h;
}

// n random elements over many binades (including past fp16's range and into its subnormals),
// with special values at every index i where i % period == phase.
std::vector<uint8_t> make_elements(DType t, size_t n, uint64_t seed, size_t period, size_t phase) {
  std::vector<uint8_t> bytes(n * dtype_size(t));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(-2.f, 2.f);
  std::uniform_int_distribution<int> exp(-30, 18);
  const std::vector<uint32_t> sp = specials(t);
  size_t next_special = seed % sp.size();
  for (size_t i = 0; i < n; ++i) {
    if (period && i % period == phase) {
      set_bits(bytes, t, i, sp[next_special++ % sp.size()]);
    } else {
      store_from_f32(bytes.data(), t, i, std::ldexp(mant(rng), exp(rng)));
    }
  }
  return bytes;
}

// Bit patterns of the values the pair tests need, per dtype.
uint32_t pos_inf(DType t) { return t == DType::kF32 ? 0x7f800000u : t == DType::kBF16 ? 0x7f80u : 0x7c00u; }
uint32_t neg_inf(DType t) { return t == DType::kF32 ? 0xff800000u : t == DType::kBF16 ? 0xff80u : 0xfc00u; }
uint32_t snan(DType t) { return t == DType::kF32 ? 0x7fa00001u : t == DType::kBF16 ? 0x7f81u : 0x7c01u; }
uint32_t neg_qnan(DType t) { return t == DType::kF32 ? 0xffc12345u : t == DType::kBF16 ? 0xffc1u : 0xfe01u; }
uint32_t one(DType t) { return t == DType::kF32 ? 0x3f800000u : t == DType::kBF16 ? 0x3f80u : 0x3c00u; }
uint32_t big(DType t) { return t == DType::kF32 ? 0x7f7fffffu : t == DType::kBF16 ? 0x7f7fu : 0x7bffu; }

// The first element where two arrays of dtype t differ, for the failure message.
::testing::AssertionResult same_bits(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu, DType t,
                                     const std::string& what) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  if (gpu == cpu) return ::testing::AssertionSuccess();
  const size_t n = gpu.size() / dtype_size(t);
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (get_bits(gpu.data(), t, i) != get_bits(cpu.data(), t, i)) {
      if (first == n) first = i;
      ++bad;
    }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %zu of %zu elements differ, first at %zu: gpu 0x%08x cpu 0x%08x", what.c_str(),
                bad, n, first, get_bits(gpu.data(), t, first), get_bits(cpu.data(), t, first));
  return ::testing::AssertionFailure() << buf;
}

std::string dtype_str(DType t) { return std::string(dtype_name(t)); }

// --- the fixture -----------------------------------------------------------------------------

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, CudaDevice not tested: " << why;
    auto r = make_cuda_device(local_gpu_index(), 8 * GiB, 4 * GiB);
    ASSERT_TRUE(r.ok()) << r.status().message();
    owner_ = std::move(r.value());
    ASSERT_STREQ(owner_->name(), "cuda");
    dev_ = static_cast<CudaDevice*>(owner_.get());
  }
  void TearDown() override {
    if (!dev_) return;
    EXPECT_TRUE(dev_->synchronize().ok());
    for (Buffer& b : buffers_) dev_->free(b);
  }

  // A buffer freed at the end of the test.
  void* alloc(size_t bytes, Tier tier = Tier::kDevice, Kind kind = Kind::kStaging) {
    auto r = dev_->alloc(bytes, tier, kind);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return nullptr;
    buffers_.push_back(r.value());
    return r.value().data;
  }
  Buffer buffer(size_t bytes, Tier tier = Tier::kDevice) {
    void* p = alloc(bytes, tier);
    return p ? buffers_.back() : Buffer{};
  }
  // Device memory holding `bytes`.
  void* on_device(const std::vector<uint8_t>& bytes) {
    void* p = alloc(bytes.size());
    if (p) {
      EXPECT_TRUE(dev_->upload(p, bytes.data(), bytes.size()).ok());
    }
    return p;
  }
  std::vector<uint8_t> fetch(const void* p, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    Status s = dev_->download(out.data(), p, bytes);
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }
  double fetch_double(const double* p) {
    double d = 0;
    Status s = dev_->download(&d, p, sizeof d);
    EXPECT_TRUE(s.ok()) << s.message();
    return d;
  }

  std::unique_ptr<Device> owner_;
  CudaDevice* dev_ = nullptr;
  std::vector<Buffer> buffers_;
};

// --- factory -------------------------------------------------------------------------------

TEST(CudaDeviceFactory, MissingGpuIsOneLineNamingTheKey) {
  std::string why;
  const size_t gpus = gpu::list_gpus(&why).size();
  // Without a GPU any index fails; with one, an index past the last does.
  auto r = make_cuda_device(static_cast<int>(gpus), GiB, GiB);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidInput);
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind("config key 'zoe.device': \"cuda\" needs a GPU: ", 0), 0u) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  if (gpus == 0) {
    EXPECT_NE(m.find(why), std::string::npos) << m;
  } else {
    EXPECT_NE(m.find("was asked for"), std::string::npos) << m;
  }
  const int idx = local_gpu_index();
  EXPECT_GE(idx, 0);
  if (gpus > 0) {
    EXPECT_LT(idx, static_cast<int>(gpus));
  }
}

// --- copies ----------------------------------------------------------------------------------

TEST_F(CudaDeviceTest, CopiesRoundTripThroughEveryKindOfMemory) {
  const size_t n = 3 * MiB + 17;
  std::vector<uint8_t> src(n);
  std::mt19937_64 rng(1);
  for (auto& b : src) b = static_cast<uint8_t>(rng());

  // pageable host -> device -> device (copy_async with offsets) -> pinned host -> pageable
  Buffer d1 = buffer(n), d2 = buffer(n + 100), h1 = buffer(n + 50, Tier::kHost);
  ASSERT_TRUE(d1 && d2 && h1);
  ASSERT_TRUE(dev_->upload(d1.data, src.data(), n).ok());
  ASSERT_TRUE(dev_->copy_async(d2, 100, d1, 0, n, Stream::kCompute).ok());
  ASSERT_TRUE(dev_->wait_on(Stream::kD2H, dev_->record(Stream::kCompute)).ok());
  ASSERT_TRUE(dev_->copy_async(h1, 50, d2, 100, n, Stream::kD2H).ok());
  ASSERT_TRUE(dev_->wait(dev_->record(Stream::kD2H)).ok());
  EXPECT_EQ(std::memcmp(h1.as<char>() + 50, src.data(), n), 0) << "device -> pinned host";

  // pinned host -> device on the h2d stream, raw copy() on the comm stream, download
  std::memset(h1.data, 0, h1.bytes);
  std::memcpy(h1.data, src.data() + 1, n - 1);
  ASSERT_TRUE(dev_->copy_async(d1, 0, h1, 0, n - 1, Stream::kH2D).ok());
  ASSERT_TRUE(dev_->wait_on(Stream::kComm, dev_->record(Stream::kH2D)).ok());
  ASSERT_TRUE(dev_->copy(d2.data, d1.data, n - 1, Stream::kComm).ok());
  ASSERT_TRUE(dev_->wait_on(Stream::kCompute, dev_->record(Stream::kComm)).ok());
  std::vector<uint8_t> back = fetch(d2.data, n - 1);
  EXPECT_EQ(std::memcmp(back.data(), src.data() + 1, n - 1), 0) << "pinned host -> device -> device";

  // zero on a copy stream
  ASSERT_TRUE(dev_->zero(static_cast<char*>(d2.data) + 10, 1000, Stream::kH2D).ok());
  ASSERT_TRUE(dev_->wait(dev_->record(Stream::kH2D)).ok());
  back = fetch(d2.data, 2000);
  for (size_t i = 0; i < 2000; ++i)
    ASSERT_EQ(back[i], (i >= 10 && i < 1010) ? 0 : src[1 + i]) << "byte " << i;

  // bounds are checked
  Status s = dev_->copy_async(d1, 1, d2, 0, n, Stream::kCompute);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("out of bounds"), std::string::npos) << s.message();
  EXPECT_TRUE(dev_->copy(nullptr, d1.data, 0, Stream::kCompute).ok());  // nothing to copy
}

TEST_F(CudaDeviceTest, RegisteredHostMemoryIsReachableByCopiesAndKernels) {
  const size_t n = 1 << 20;
  void* host = std::aligned_alloc(4096, n * 4);
  ASSERT_NE(host, nullptr);
  std::vector<float> v = test::random_floats(n, 3);
  std::memcpy(host, v.data(), n * 4);
  Status s = dev_->register_host(host, n * 4);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(dev_->register_host(host, n * 4).ok()) << "registered twice";
  // A kernel reads it in place; a copy writes it.
  auto* d = static_cast<float*>(alloc(n * 4));
  ASSERT_TRUE(dev_->accumulate(d, DType::kF32, host, DType::kF32, n, false).ok());
  ASSERT_TRUE(dev_->accumulate(d, DType::kF32, host, DType::kF32, n, true).ok());  // d = 2v
  ASSERT_TRUE(dev_->wait_on(Stream::kD2H, dev_->record(Stream::kCompute)).ok());
  ASSERT_TRUE(dev_->copy(host, d, n * 4, Stream::kD2H).ok());
  ASSERT_TRUE(dev_->wait(dev_->record(Stream::kD2H)).ok());
  const float* h = static_cast<const float*>(host);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], v[i] + v[i]) << i;
  dev_->unregister_host(host);
  std::free(host);
}

// --- order -----------------------------------------------------------------------------------

// Enough kernel work to outlast a copy issued right after it (a few ms).
void busy(CudaDevice& dev, float* dst, const float* src, size_t n, int passes) {
  for (int p = 0; p < passes; ++p) ASSERT_TRUE(dev.accumulate(dst, DType::kF32, src, DType::kF32, n, false).ok());
}

// Long enough on a GPU that a missing wait shows; under tools/cuda_emu (whose streams run late,
// CUDA_EMU_DELAY, and whose race check names a missing wait) small enough to run in seconds.
#ifdef ZOE_CUDA_EMU
constexpr size_t kOrderingElems = 64 * 1024;
#else
constexpr size_t kOrderingElems = 64 * MiB;  // 256 MiB of fp32
#endif

TEST_F(CudaDeviceTest, WaitOnOrdersStreams) {
  const size_t n = kOrderingElems;
  std::vector<float> ones(n, 1.0f), twos(n, 2.0f);
  auto* a = static_cast<float*>(alloc(n * 4));
  auto* b = static_cast<float*>(alloc(n * 4));
  Buffer pinned = buffer(n * 4, Tier::kHost);
  ASSERT_TRUE(a && b && pinned);
  ASSERT_TRUE(dev_->upload(b, ones.data(), n * 4).ok());
  ASSERT_TRUE(dev_->zero(a, n * 4).ok());

  // compute writes a, then d2h copies it out: d2h must see the kernels' result.
  busy(*dev_, a, b, n, 10);
  ASSERT_TRUE(dev_->wait_on(Stream::kD2H, dev_->record(Stream::kCompute)).ok());
  ASSERT_TRUE(dev_->copy(pinned.data, a, n * 4, Stream::kD2H).ok());
  ASSERT_TRUE(dev_->wait(dev_->record(Stream::kD2H)).ok());
  for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(pinned.as<float>()[i], 1.0f) << "d2h ran before compute, " << i;
  ASSERT_EQ(pinned.as<float>()[n - 1], 1.0f);

  // h2d writes b from pinned memory, then compute reads it.
  for (size_t i = 0; i < n; ++i) pinned.as<float>()[i] = 2.0f;
  ASSERT_TRUE(dev_->copy(b, pinned.data, n * 4, Stream::kH2D).ok());
  ASSERT_TRUE(dev_->wait_on(Stream::kCompute, dev_->record(Stream::kH2D)).ok());
  ASSERT_TRUE(dev_->accumulate(a, DType::kF32, b, DType::kF32, n, false).ok());
  std::vector<uint8_t> got = fetch(a, n * 4);
  EXPECT_EQ(std::memcmp(got.data(), twos.data(), n * 4), 0) << "compute ran before h2d";

  // A chain through every stream: compute -> comm -> h2d -> d2h.
  busy(*dev_, a, b, n, 5);  // a = 2
  ASSERT_TRUE(dev_->wait_on(Stream::kComm, dev_->record(Stream::kCompute)).ok());
  ASSERT_TRUE(dev_->copy(b, a, n * 4, Stream::kComm).ok());  // b = 2
  ASSERT_TRUE(dev_->wait_on(Stream::kH2D, dev_->record(Stream::kComm)).ok());
  ASSERT_TRUE(dev_->zero(a, n * 4, Stream::kH2D).ok());  // a = 0, after the copy read it
  ASSERT_TRUE(dev_->wait_on(Stream::kD2H, dev_->record(Stream::kH2D)).ok());
  ASSERT_TRUE(dev_->copy(pinned.data, b, n * 4, Stream::kD2H).ok());
  ASSERT_TRUE(dev_->synchronize().ok());
  for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(pinned.as<float>()[i], 2.0f) << i;
  got = fetch(a, 4096);
  for (size_t i = 0; i < 1024; ++i) ASSERT_EQ(reinterpret_cast<float*>(got.data())[i], 0.0f) << i;
}

TEST_F(CudaDeviceTest, UploadAndDownloadWaitForTheComputeStream) {
  const size_t n = kOrderingElems;
  std::vector<float> ones(n, 1.0f), threes(n, 3.0f);
  auto* a = static_cast<float*>(alloc(n * 4));
  auto* b = static_cast<float*>(alloc(n * 4));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(dev_->upload(b, ones.data(), n * 4).ok());
  ASSERT_TRUE(dev_->zero(a, n * 4).ok());
  // download right after kernels that write a: it must see their result.
  busy(*dev_, a, b, n, 10);
  std::vector<uint8_t> got = fetch(a, n * 4);
  EXPECT_EQ(std::memcmp(got.data(), ones.data(), n * 4), 0) << "download did not wait for compute";
  // upload right after kernels that write a: the kernels must not overwrite the upload.
  busy(*dev_, a, b, n, 10);
  ASSERT_TRUE(dev_->upload(a, threes.data(), n * 4).ok());
  got = fetch(a, n * 4);
  EXPECT_EQ(std::memcmp(got.data(), threes.data(), n * 4), 0) << "upload did not wait for compute";
}

#ifdef ZOE_CUDA_EMU
extern "C" unsigned long long cuda_emu_pageable_copies(void);
extern "C" unsigned long long cuda_emu_calls(const char* kind);

// A fetch of a chunk held in host memory (the parameters offloaded to the CPU) leaves the host
// free: finish_for_compute() has the compute stream wait for the upload, with no host wait on an
// event or a stream, and kernels queued after it read the chunk (the emulation's stream check
// would name a kernel reading it before the copy ran). The chunk queued behind busy kernels on
// the compute stream, whose end the upload waits for.
TEST_F(CudaDeviceTest, AFetchFromHostMemoryHasTheComputeStreamWaitNotTheHost) {
  const int64_t n = kOrderingElems;
  StateArray a;
  ASSERT_TRUE(a.allocate(*dev_, {Tier::kHost, 1.0, nullptr, ""}, n, 4, Kind::kParam).ok());
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * 0.5f;
  ASSERT_FALSE(a.on_nvme(0));
  ASSERT_TRUE(dev_->synchronize().ok());  // the allocation's zero fill has run
  std::memcpy(a.buffer_of(0).as<char>() + a.buffer_offset(0), v.data(), n * 4);  // host memory
  Buffer dst = buffer(n * 4), other = buffer(n * 4), sum = buffer(n * 4);
  ASSERT_TRUE(dst && other && sum);
  ASSERT_TRUE(dev_->zero(dst.data, n * 4).ok());
  ASSERT_TRUE(dev_->zero(sum.data, n * 4).ok());
  busy(*dev_, other.as<float>(), sum.as<float>(), n, 10);  // the upload waits for these
  const unsigned long long host_waits =
      cuda_emu_calls("cudaEventSynchronize") + cuda_emu_calls("cudaStreamSynchronize");
  {
    ChunkLoad load(*dev_, nullptr, a, 0, n, dst, 0, n);
    ASSERT_TRUE(load.start().ok());
    ASSERT_TRUE(load.finish_for_compute().ok());
  }  // and its end does not wait either
  EXPECT_EQ(cuda_emu_calls("cudaEventSynchronize") + cuda_emu_calls("cudaStreamSynchronize"), host_waits);
  ASSERT_TRUE(dev_->accumulate(sum.data, DType::kF32, dst.data, DType::kF32, n, false).ok());  // reads dst
  const std::vector<uint8_t> got = fetch(sum.data, n * 4);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = v[i];
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0);
  a.release(*dev_);
}

// A fetch of a chunk on NVMe, three pinned windows: the host does not wait for their uploads; the
// windows go to the retirement, the compute stream waits for the copies (a kernel after the fetch
// reads the chunk), and the windows come back to the pool once the copies ran (the pool asks the
// retirement when it runs short). The emulation's pinned guard would name a window reused early.
TEST_F(CudaDeviceTest, AFetchFromNvmeRetiresItsWindowsInsteadOfWaiting) {
  const std::string dir = test::make_temp_dir("fetch-retire");
  auto pool = PinnedPool::create({1 << 20, /*pin=*/false, &dev_->ledger()});
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  PinnedPool& p = **pool;
  ASSERT_TRUE(dev_->register_host(p.base(), p.capacity()).ok());
  NvmeStoreOptions o;
  o.nvme_path = dir;
  o.job = "retire";
  o.block_size = 4096;
  o.ledger = &dev_->ledger();
  o.pool = &p;
  auto opened = NvmeStore::open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  std::unique_ptr<NvmeStore> store = std::move(opened).value();
  const int64_t n = 5000;
  StateArray a;
  const std::vector<int64_t> units = {0};
  ASSERT_TRUE(a.allocate(*dev_, {Tier::kNvme, 1.0, store.get(), "param"}, n, 4, Kind::kParam, units).ok());
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 977) - 300.f;
  ASSERT_TRUE(a.wait(a.write_async(0, n, v.data())).ok());
  WindowRetirement retirement(*dev_);
  p.set_reclaimer([&](bool block) { return retirement.reclaim(block); });
  const uint64_t free_before = p.available();
  Buffer dst = buffer(n * 4), other = buffer(n * 4), sum = buffer(n * 4);
  ASSERT_TRUE(dst && other && sum);
  ASSERT_TRUE(dev_->zero(sum.data, n * 4).ok());
  busy(*dev_, other.as<float>(), sum.as<float>(), n, 20);  // the uploads wait for these
  const unsigned long long host_waits =
      cuda_emu_calls("cudaEventSynchronize") + cuda_emu_calls("cudaStreamSynchronize");
  {
    ChunkLoad load(*dev_, &p, a, 0, n, dst, 0, 2048, &retirement);
    ASSERT_TRUE(load.start().ok());
    ASSERT_TRUE(load.finish_for_compute().ok());
  }
  EXPECT_EQ(cuda_emu_calls("cudaEventSynchronize") + cuda_emu_calls("cudaStreamSynchronize"), host_waits);
  EXPECT_LE(retirement.held(), 1u);  // 1 while the copies wait behind the busy kernels (0 had they run)
  {
    // What the pool gives now is refilled at once, as the next NVMe read would: a window whose
    // copy has not run yet must not be among it (the pinned guard would name the copy).
    p.reclaim_ready();
    auto rest = p.try_acquire(p.available());
    ASSERT_TRUE(rest.ok());
    if (rest->data()) std::memset(rest->data(), 0x5a, rest->size());
  }
  ASSERT_TRUE(dev_->accumulate(sum.data, DType::kF32, dst.data, DType::kF32, n, false).ok());  // reads dst
  const std::vector<uint8_t> got = fetch(sum.data, n * 4);
  EXPECT_EQ(std::memcmp(got.data(), v.data(), n * 4), 0);
  p.reclaim_ready();  // the copies ran (the download above waited for the compute stream)
  EXPECT_EQ(retirement.held(), 0u);
  EXPECT_EQ(p.available(), free_before);
  p.set_reclaimer(nullptr);
  a.release(*dev_);
  ASSERT_TRUE(store->close().ok());
  dev_->unregister_host(p.base());
  std::filesystem::remove_all(dir);
}

// The emulation treats an async copy from pageable memory as CUDA does (it has finished when the
// call returns) and counts it; one from pinned memory stays asynchronous and is not counted.
TEST_F(CudaDeviceTest, EmulationCountsPageableCopies) {
  const size_t n = 4096;
  auto* d = static_cast<float*>(alloc(n * 4));
  Buffer pinned = buffer(n * 4, Tier::kHost);
  ASSERT_TRUE(d && pinned);
  std::vector<float> pageable(n, 5.0f);
  const unsigned long long before = cuda_emu_pageable_copies();
  ASSERT_TRUE(dev_->copy(d, pageable.data(), n * 4, Stream::kH2D).ok());
  EXPECT_EQ(cuda_emu_pageable_copies(), before + 1);
  pageable.assign(n, -1.0f);  // no wait: the copy had read it already
  for (size_t i = 0; i < n; ++i) pinned.as<float>()[i] = 7.0f;
  ASSERT_TRUE(dev_->copy(pinned.data, d, n * 4, Stream::kH2D).ok());
  EXPECT_EQ(cuda_emu_pageable_copies(), before + 1);
  ASSERT_TRUE(dev_->synchronize().ok());
  for (size_t i = 0; i < n; i += 511) ASSERT_EQ(pinned.as<float>()[i], 5.0f) << i;
}
#endif

// A framework's stream (torch's current stream for zoe.torch) writes a buffer; after
// wait_external, work on every zoe stream sees the write (on the emulation a missing wait is also
// a race report).
TEST_F(CudaDeviceTest, WaitExternalOrdersEveryStreamAfterTheCallersStream) {
  const size_t n = kOrderingElems;
  auto* a = static_cast<float*>(alloc(n * 4));
  Buffer pinned = buffer(n * 4, Tier::kHost);
  ASSERT_TRUE(a && pinned);
  ASSERT_TRUE(dev_->zero(a, n * 4).ok());
  ASSERT_TRUE(dev_->synchronize().ok());
  cudaStream_t theirs = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&theirs, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a, 0x3f, n * 4, theirs), cudaSuccess);  // 0x3f3f3f3f: 0.747...
  ASSERT_TRUE(dev_->wait_external(theirs).ok());
  ASSERT_TRUE(dev_->copy(pinned.data, a, n * 4, Stream::kD2H).ok());
  ASSERT_TRUE(dev_->wait(dev_->record(Stream::kD2H)).ok());
  uint32_t bits = 0;
  for (size_t i = 0; i < n; i += 1021) {
    std::memcpy(&bits, pinned.as<float>() + i, 4);
    ASSERT_EQ(bits, 0x3f3f3f3fu) << "d2h ran before the caller's stream, " << i;
  }
  ASSERT_EQ(cudaStreamSynchronize(theirs), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(theirs), cudaSuccess);
}

TEST_F(CudaDeviceTest, Events) {
  EXPECT_TRUE(dev_->wait(Event{}).ok());  // nothing recorded: nothing to wait for
  EXPECT_TRUE(dev_->wait_on(Stream::kComm, Event{}).ok());
  Event first = dev_->record(Stream::kCompute);
  EXPECT_EQ(first.stream, Stream::kCompute);
  Event second = dev_->record(Stream::kCompute);
  EXPECT_GT(second.seq, first.seq);
  Status s = dev_->wait(Event{Stream::kCompute, second.seq + 1000});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("never recorded"), std::string::npos) << s.message();
  // Past the ring: an old event still works (it stands for a later one of its stream).
  for (uint64_t i = 0; i < 2 * CudaDevice::kEventRing + 5; ++i) dev_->record(Stream::kH2D);
  for (uint64_t i = 0; i < 2 * CudaDevice::kEventRing + 5; ++i) dev_->record(Stream::kCompute);
  EXPECT_TRUE(dev_->wait(first).ok());
  EXPECT_TRUE(dev_->wait_on(Stream::kD2H, first).ok());
  EXPECT_TRUE(dev_->wait_on(Stream::kCompute, first).ok());  // its own stream: nothing to do
  EXPECT_TRUE(dev_->synchronize().ok());
}

// --- kernels vs the CPU ----------------------------------------------------------------------

// The CPU device's accumulate, element for element (cpu_device.cc).
void accumulate_cpu(void* dst, DType t, const void* src, DType st, size_t n, bool accumulate) {
  for (size_t i = 0; i < n; ++i) {
    float v = load_as_f32(src, st, i);
    if (accumulate) v = load_as_f32(dst, t, i) + v;
    store_from_f32(dst, t, i, v);
  }
}

TEST_F(CudaDeviceTest, AccumulateIsBitwiseTheCpus) {
  const size_t n = 200003;
  const DType all[] = {DType::kF32, DType::kBF16, DType::kF16};
  uint64_t seed = 10;
  for (DType dt : all)
    for (DType st : all)
      for (bool acc : {false, true}) {
        const std::string what = "dst " + dtype_str(dt) + " src " + dtype_str(st) + (acc ? " accumulate" : " store");
        // Specials in dst at i % 11 == 0, in src at i % 11 == 5: never two NaNs in one sum
        // (where the CPU's NaN depends on its compiler's operand order).
        std::vector<uint8_t> dst = make_elements(dt, n, seed++, 11, 0);
        std::vector<uint8_t> src = make_elements(st, n, seed++, 11, 5);
        // Pairs at 1..6: inf - inf (the default NaN), NaN + 1, 1 + NaN, overflow, -inf + inf.
        const struct {
          size_t i;
          uint32_t d, s;
        } pairs[] = {{1, pos_inf(dt), neg_inf(st)}, {2, snan(dt), one(st)}, {3, one(dt), neg_qnan(st)},
                     {4, big(dt), big(st)},         {6, neg_inf(dt), pos_inf(st)}, {7, one(dt), snan(st)}};
        for (const auto& p : pairs) {
          set_bits(dst, dt, p.i, p.d);
          set_bits(src, st, p.i, p.s);
        }
        void* d_dst = on_device(dst);
        void* d_src = on_device(src);
        ASSERT_TRUE(d_dst && d_src);
        Status s = dev_->accumulate(d_dst, dt, d_src, st, n, acc);
        ASSERT_TRUE(s.ok()) << s.message();
        accumulate_cpu(dst.data(), dt, src.data(), st, n, acc);
        EXPECT_TRUE(same_bits(fetch(d_dst, dst.size()), dst, dt, what));
      }
  EXPECT_TRUE(dev_->accumulate(nullptr, DType::kF32, nullptr, DType::kF32, 0, true).ok());  // n = 0
}

TEST_F(CudaDeviceTest, SumChunksIsBitwiseTheCpus) {
  const size_t count = 70001;
  uint64_t seed = 100;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    for (int n : {1, 2, 3, 5, 8}) {
      const std::string what = dtype_str(t) + " x " + std::to_string(n) + " chunks";
      const size_t chunk_bytes = count * dtype_size(t);
      std::vector<uint8_t> chunks;
      for (int k = 0; k < n; ++k) {  // chunk k's specials at i % 17 == k: one NaN per sum at most
        std::vector<uint8_t> c = make_elements(t, count, seed++, 17, static_cast<size_t>(k));
        chunks.insert(chunks.end(), c.begin(), c.end());
      }
      if (n >= 2) {  // (61 and 62 are 10 and 11 mod 17: no chunk has a special there)
        set_bits(chunks, t, 61, pos_inf(t));  // element 61: inf + -inf, then more terms added to the NaN
        set_bits(chunks, t, count + 61, neg_inf(t));
        set_bits(chunks, t, 62, big(t));  // element 62: overflow to inf
        set_bits(chunks, t, count + 62, big(t));
      }
      std::vector<uint8_t> cpu(chunk_bytes);
      sum_chunks_in_order(chunks.data(), n, count, t, cpu.data());
      void* d_chunks = on_device(chunks);
      auto* d_out = alloc(chunk_bytes);
      ASSERT_TRUE(d_chunks && d_out);
      Status s = dev_->sum_chunks(d_out, d_chunks, n, count, t);
      ASSERT_TRUE(s.ok()) << s.message();
      EXPECT_TRUE(same_bits(fetch(d_out, chunk_bytes), cpu, t, what));
      // In place over chunk 0 (reduce_scatter's recv may alias its own chunk of send).
      s = dev_->sum_chunks(d_chunks, d_chunks, n, count, t);
      ASSERT_TRUE(s.ok()) << s.message();
      EXPECT_TRUE(same_bits(fetch(d_chunks, chunk_bytes), cpu, t, what + " in place"));
    }
  EXPECT_FALSE(dev_->sum_chunks(nullptr, nullptr, 0, 10, DType::kF32).ok());
}

TEST_F(CudaDeviceTest, SumSquaresMatchesFloat64AndIsDeterministic) {
  struct In {
    DType t;
    size_t n;
    Tier tier;
  };
  std::vector<In> ins = {{DType::kF32, 0, Tier::kDevice},         {DType::kF32, 1, Tier::kDevice},
                         {DType::kBF16, 65535, Tier::kDevice},    {DType::kF16, 65536, Tier::kDevice},
                         {DType::kF32, 65537, Tier::kHost},       {DType::kBF16, (1 << 20) + 3, Tier::kDevice},
                         {DType::kF32, 3000017, Tier::kDevice},   {DType::kF16, 777777, Tier::kDevice}};
  for (int i = 0; i < 150; ++i)  // more spans than one launch takes
    ins.push_back({static_cast<DType>(i % 3), static_cast<size_t>(1 + (i * 7919) % 5000), Tier::kDevice});
  std::vector<ArrayView> spans;
  long double ref = 0;
  uint64_t seed = 1000;
  for (const In& in : ins) {
    std::vector<float> v = test::random_floats(in.n, seed++, -3.f, 3.f);
    std::vector<uint8_t> bytes(in.n * dtype_size(in.t));
    for (size_t i = 0; i < in.n; ++i) store_from_f32(bytes.data(), in.t, i, v[i]);
    for (size_t i = 0; i < in.n; ++i) {
      const long double x = load_as_f32(bytes.data(), in.t, i);
      ref += x * x;
    }
    void* p = alloc(std::max<size_t>(bytes.size(), 1), in.tier);
    ASSERT_NE(p, nullptr);
    if (in.tier == Tier::kHost) {
      std::memcpy(p, bytes.data(), bytes.size());
    } else {
      ASSERT_TRUE(dev_->upload(p, bytes.data(), bytes.size()).ok());
    }
    spans.push_back(ArrayView{p, in.t, in.n});
  }
  auto* out = static_cast<double*>(alloc(sizeof(double)));
  ASSERT_NE(out, nullptr);
  double first = 0;
  for (int run = 0; run < 3; ++run) {
    ASSERT_TRUE(dev_->zero(out, sizeof(double)).ok());
    Status s = dev_->sum_squares(spans.data(), spans.size(), out);
    ASSERT_TRUE(s.ok()) << s.message();
    const double got = fetch_double(out);
    EXPECT_NEAR(got, static_cast<double>(ref), 1e-12 * static_cast<double>(ref)) << "run " << run;
    if (run == 0) first = got;
    else EXPECT_EQ(std::memcmp(&got, &first, sizeof got), 0) << "run " << run << " differs from run 0";
  }
  // It adds to *out: a second call doubles it exactly.
  ASSERT_TRUE(dev_->sum_squares(spans.data(), spans.size(), out).ok());
  EXPECT_EQ(fetch_double(out), 2 * first);
  // Nothing to sum leaves *out alone.
  ASSERT_TRUE(dev_->sum_squares(spans.data(), 1, out).ok());  // the empty span
  ASSERT_TRUE(dev_->sum_squares(nullptr, 0, out).ok());
  EXPECT_EQ(fetch_double(out), 2 * first);
}

// One Adam range on the host (the CPU steps it) and on the device.
struct AdamCase {
  DType grad_dtype;
  bool has_copy;
  DType param_dtype;
  bool decay;
  size_t n, offset;
  std::vector<uint8_t> grad, out;
  std::vector<float> master, m, v;
  void *d_grad = nullptr, *d_master = nullptr, *d_m = nullptr, *d_v = nullptr, *d_out = nullptr;

  AdamRange range(void* g, void* p, void* mm, void* vv, void* o) const {
    AdamRange r;
    r.grad = static_cast<uint8_t*>(g) + offset * dtype_size(grad_dtype);
    r.grad_dtype = grad_dtype;
    r.master = static_cast<float*>(p) + offset;
    r.exp_avg = static_cast<float*>(mm) + offset;
    r.exp_avg_sq = static_cast<float*>(vv) + offset;
    r.param_out = has_copy ? static_cast<uint8_t*>(o) + offset * dtype_size(param_dtype) : nullptr;
    r.param_dtype = param_dtype;
    r.n = n;
    r.decay = decay;
    return r;
  }
};

TEST_F(CudaDeviceTest, AdamOverManyRangesWithMixedDecayIsBitwiseTheCpus) {
  std::vector<AdamCase> cases;
  const size_t lengths[] = {0, 1, 9, 4097, 70001};
#ifdef ZOE_CUDA_EMU  // each GPU thread on the CPU: the long range in 3 of the 12 (gradient, copy) pairs
  auto has_long_range = [](int g, int copy) { return (g + copy) % 4 == 0; };
#else
  auto has_long_range = [](int, int) { return true; };
#endif
  uint64_t seed = 5000;
  const DType grads[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (int gi = 0; gi < 3; ++gi)
    for (int copy = 0; copy < 4; ++copy)  // none, fp32, bf16, fp16
      for (bool decay : {true, false})
        for (size_t n : lengths) {
          if (n == 70001 && !has_long_range(gi, copy)) continue;
          AdamCase c;
          c.grad_dtype = grads[gi];
          c.has_copy = copy != 0;
          c.param_dtype = copy == 1 ? DType::kF32 : copy == 2 ? DType::kBF16 : DType::kF16;
          c.decay = decay;
          c.n = n;
          c.offset = seed % 3 == 0 ? 1 : 0;  // every third range unaligned
          const size_t total = n + c.offset;
          c.grad.resize(total * dtype_size(c.grad_dtype));
          c.out.assign(total * dtype_size(c.param_dtype), 0);
          c.master = test::random_floats(total, seed, -1.f, 1.f);
          c.m = test::random_floats(total, seed + 1, -0.01f, 0.01f);
          c.v = test::random_floats(total, seed + 2, 0.f, 1e-4f);
          seed += 3;
          cases.push_back(std::move(c));
        }
  ASSERT_GT(cases.size(), 2u * 48u);  // more ranges than one launch takes, in each decay group
  for (AdamCase& c : cases) {
    const size_t total = c.n + c.offset;
    c.d_grad = alloc(c.grad.size() + 1, Tier::kDevice, Kind::kGrad);
    c.d_master = alloc(total * 4 + 1, Tier::kDevice, Kind::kMaster);
    c.d_m = alloc(total * 4 + 1, Tier::kDevice, Kind::kExpAvg);
    c.d_v = alloc(total * 4 + 1, Tier::kDevice, Kind::kExpAvgSq);
    c.d_out = alloc(c.out.size() + 1, Tier::kDevice, Kind::kParam);
    ASSERT_TRUE(c.d_grad && c.d_master && c.d_m && c.d_v && c.d_out);
    ASSERT_TRUE(dev_->upload(c.d_master, c.master.data(), total * 4).ok());
    ASSERT_TRUE(dev_->upload(c.d_m, c.m.data(), total * 4).ok());
    ASSERT_TRUE(dev_->upload(c.d_v, c.v.data(), total * 4).ok());
    ASSERT_TRUE(dev_->upload(c.d_out, c.out.data(), c.out.size()).ok());
  }
  auto* d_count = static_cast<uint64_t*>(alloc(sizeof(uint64_t)));
  ASSERT_NE(d_count, nullptr);
  ASSERT_TRUE(dev_->zero(d_count, sizeof(uint64_t)).ok());
  uint64_t cpu_bad = 0;
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    AdamHyper h;
    h.lr = 3e-3;
    h.beta1 = 0.85;
    h.beta2 = 0.995;
    h.eps = 1e-7;
    h.weight_decay = step == 3 ? 0.05 : 0.1;
    h.decoupled = step != 3;  // AdamW twice, then Adam with L2
    h.step = step;
    h.grad_scale = 0.5f;
    std::vector<AdamRange> host, device;
    for (AdamCase& c : cases) {
      std::vector<float> g = test::random_floats(c.n + c.offset, seed++, -1024.f, 1024.f);
      for (size_t i = 0; i < g.size(); ++i) store_from_f32(c.grad.data(), c.grad_dtype, i, g[i]);
      if (c.n > 3) {
        store_from_f32(c.grad.data(), c.grad_dtype, c.offset + c.n / 3, std::numeric_limits<float>::infinity());
        store_from_f32(c.grad.data(), c.grad_dtype, c.offset + c.n - 1, std::numeric_limits<float>::quiet_NaN());
      }
      ASSERT_TRUE(dev_->upload(c.d_grad, c.grad.data(), c.grad.size()).ok());
      host.push_back(c.range(c.grad.data(), c.master.data(), c.m.data(), c.v.data(), c.out.data()));
      device.push_back(c.range(c.d_grad, c.d_master, c.d_m, c.d_v, c.d_out));
    }
    for (const AdamRange& r : host) cpu_bad += adam_step_range(h, r, Isa::kScalar);
    Status s = dev_->adam(h, device.data(), device.size(), d_count);
    ASSERT_TRUE(s.ok()) << s.message();
    uint64_t gpu_bad = 0;
    ASSERT_TRUE(dev_->download(&gpu_bad, d_count, sizeof gpu_bad).ok());
    EXPECT_EQ(gpu_bad, cpu_bad);
    for (size_t i = 0; i < cases.size(); ++i) {
      const AdamCase& c = cases[i];
      const size_t total = c.n + c.offset;
      const std::string what = "range " + std::to_string(i) + " grad " + dtype_str(c.grad_dtype) + " copy " +
                               (c.has_copy ? dtype_str(c.param_dtype) : "none") + (c.decay ? " decay" : " no decay") +
                               " n " + std::to_string(c.n) + " offset " + std::to_string(c.offset);
      auto bytes_of = [](const std::vector<float>& f) {
        return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(f.data()),
                                    reinterpret_cast<const uint8_t*>(f.data() + f.size()));
      };
      EXPECT_TRUE(same_bits(fetch(c.d_master, total * 4), bytes_of(c.master), DType::kF32, what + " master"));
      EXPECT_TRUE(same_bits(fetch(c.d_m, total * 4), bytes_of(c.m), DType::kF32, what + " exp_avg"));
      EXPECT_TRUE(same_bits(fetch(c.d_v, total * 4), bytes_of(c.v), DType::kF32, what + " exp_avg_sq"));
      EXPECT_TRUE(same_bits(fetch(c.d_out, c.out.size()), c.out, c.param_dtype, what + " weights"));
      if (HasFailure()) return;
    }
  }
  EXPECT_FALSE(dev_->adam(AdamHyper{}, nullptr, 3, d_count).ok());
}

// --- memory: budgets, cache, ledger ------------------------------------------------------------

TEST(CudaDeviceMemory, BudgetsAreEnforcedWithTheirKeysAndTheLedgerSkipsTheCache) {
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, CudaDevice not tested: " << why;
  auto r = make_cuda_device(local_gpu_index(), 64 * MiB, 16 * MiB);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto& dev = static_cast<CudaDevice&>(*r.value());

  auto a = dev.alloc(48 * MiB, Tier::kDevice, Kind::kParam);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = dev.alloc(32 * MiB, Tier::kDevice, Kind::kGrad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kOutOfMemory);
  EXPECT_NE(b.status().message().find("asked for 33554432 bytes"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("zoe.device_memory_budget"), std::string::npos) << b.status().message();
  auto h = dev.alloc(12 * MiB, Tier::kHost, Kind::kStaging);
  ASSERT_TRUE(h.ok()) << h.status().message();
  auto h2 = dev.alloc(8 * MiB, Tier::kHost, Kind::kStaging);
  ASSERT_FALSE(h2.ok());
  EXPECT_NE(h2.status().message().find("zoe.host_memory_budget"), std::string::npos) << h2.status().message();
  EXPECT_FALSE(dev.alloc(10, Tier::kNvme, Kind::kParam).ok());

  LedgerSnapshot s = dev.ledger().snapshot();
  EXPECT_EQ(s.bytes[0][static_cast<int>(Kind::kParam)], 48 * MiB);
  EXPECT_EQ(s.bytes[0][static_cast<int>(Kind::kGrad)], 0u);
  EXPECT_EQ(s.bytes[1][static_cast<int>(Kind::kStaging)], 12 * MiB);

  // Freed memory stays cached (out of the ledger) and serves the next request of its size.
  void* p = a.value().data;
  dev.free(a.value());
  EXPECT_EQ(a.value().data, nullptr);
  EXPECT_EQ(dev.ledger().snapshot().bytes[0][static_cast<int>(Kind::kParam)], 0u);
  EXPECT_EQ(dev.device_memory().cached, 48 * MiB);
  auto c = dev.alloc(40 * MiB, Tier::kDevice, Kind::kGrad);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.value().data, p);
  EXPECT_EQ(dev.device_memory().raw_mallocs, 1u);
  EXPECT_EQ(dev.ledger().snapshot().bytes[0][static_cast<int>(Kind::kGrad)], 40 * MiB);
  // The cache goes back before a request that needs its room fails.
  dev.free(c.value());
  auto d = dev.alloc(60 * MiB, Tier::kDevice, Kind::kActivation);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(dev.device_memory().raw_frees, 1u);
  dev.free(d.value());
  dev.free(h.value());
  EXPECT_EQ(dev.ledger().snapshot().bytes[1][static_cast<int>(Kind::kStaging)], 0u);
  EXPECT_EQ(dev.ledger().snapshot().peak[0], 60 * MiB);
}

// The compute ops' workspaces (cuBLASLt's, the scratch of their reductions) come from the device
// budget and show in the ledger as the model's activations, as PyTorch's allocator holds its
// cuBLAS workspaces: a budget without room for them is an error naming it, at the ops' start or
// at the op that needs more, and the op runs once room is made.
TEST(CudaDeviceMemory, TheOpsWorkspacesComeFromTheBudgetAndShowInTheLedger) {
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, CudaDevice not tested: " << why;
  constexpr int kAct = static_cast<int>(Kind::kActivation);
  auto has = [](const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; };
  {
    auto small = make_cuda_device(local_gpu_index(), 16 * MiB, 16 * MiB);
    ASSERT_TRUE(small.ok()) << small.status().message();
    const Status s = (*small)->ops().status();
    EXPECT_EQ(s.code(), Code::kOutOfMemory) << s.message();
    EXPECT_TRUE(has(s, "the cuBLASLt workspace (33554432 bytes): device memory budget exhausted")) << s.message();
    EXPECT_TRUE(has(s, "zoe.device_memory_budget")) << s.message();
    EXPECT_EQ((*small)->ledger().snapshot().bytes[0][kAct], 0u);
  }
  constexpr size_t kBudget = 40 * MiB;
  auto r = make_cuda_device(local_gpu_index(), kBudget, 16 * MiB);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto& dev = static_cast<CudaDevice&>(*r.value());
  auto& ops = static_cast<gpu::CudaModelOps&>(dev.ops());
  ASSERT_TRUE(ops.status().ok()) << ops.status().message();
  EXPECT_EQ(dev.ledger().snapshot().bytes[0][kAct], 32 * MiB);
  EXPECT_EQ(ops.workspace_bytes(), 32 * MiB);
  // The op's operands in mapped pinned memory (the device reaches it): the device budget holds
  // the workspace and, next, a filler of everything else.
  constexpr int N = 4, V = 8;
  auto in = dev.alloc(N * V * 4 + N * 4 + 4, Tier::kHost, Kind::kStaging);
  ASSERT_TRUE(in.ok()) << in.status().message();
  auto* logits = in->as<float>();
  auto* targets = reinterpret_cast<int32_t*>(logits + N * V);
  auto* loss = reinterpret_cast<float*>(targets + N);
  for (int i = 0; i < N * V; ++i) logits[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  for (int n = 0; n < N; ++n) targets[n] = (3 * n + 1) % V;
  const float expected = gpt2::crossentropy_forward_backward(nullptr, nullptr, logits, targets, N, V, 1.0f);
  auto filler = dev.alloc(kBudget - dev.device_memory().reserved, Tier::kDevice, Kind::kParam);
  ASSERT_TRUE(filler.ok()) << filler.status().message();
  ops.crossentropy(loss, nullptr, logits, targets, N, V, 1.0f);
  const Status full = ops.status();
  EXPECT_EQ(full.code(), Code::kOutOfMemory) << full.message();
  EXPECT_TRUE(has(full, "crossentropy(N 4, V 8): the ops scratch (1048576 bytes): device memory budget exhausted"))
      << full.message();
  EXPECT_TRUE(has(full, "zoe.device_memory_budget")) << full.message();
  // With room again (the filler's segment goes back to make it), the op runs and its scratch
  // joins the workspace in the ledger; the budget held throughout.
  dev.free(*filler);
  ops.clear_status();
  ops.crossentropy(loss, nullptr, logits, targets, N, V, 1.0f);
  ASSERT_TRUE(dev.synchronize().ok());
  ASSERT_TRUE(ops.status().ok()) << ops.status().message();
  EXPECT_NEAR(*loss, expected, 1e-5f * std::fabs(expected));
  EXPECT_EQ(dev.ledger().snapshot().bytes[0][kAct], ops.workspace_bytes());
  EXPECT_EQ(ops.workspace_bytes(), 33 * MiB);
  EXPECT_LE(dev.device_memory().reserved, kBudget);
  EXPECT_LE(dev.ledger().snapshot().peak[0], kBudget);
  dev.free(*in);
}

// zoe.device_memory_budget "auto" leaves 3 GiB of the GPU's free memory outside the budget
// (resolve_device_budget) for what zoe cannot book: the CUDA context and the libraries' own
// memory. What the GPU holds beyond the device's segments after the ops' first bf16 product and
// attention forward and backward (cuBLASLt's and, where it runs, cuDNN's handles and plans) stays
// under it; the figure is printed for tools/gpu-check.sh's log (NCCL's, at several ranks, is not
// in it). The emulation has no context: its figure is its pages' rounding.
TEST(CudaDeviceMemory, WhatTheGpuHoldsOutsideTheBudgetIsUnderAutosMargin) {
  std::string why;
  if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, CudaDevice not tested: " << why;
  auto r = make_cuda_device(local_gpu_index(), 256 * MiB, 16 * MiB);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto& dev = static_cast<CudaDevice&>(*r.value());
  ModelOps& ops = dev.ops();
  constexpr int B = 1, T = 64, C = 128, NH = 2, N = B * T;
  std::vector<Buffer> held;
  auto take = [&](size_t bytes) {
    auto b = dev.alloc(bytes, Tier::kDevice, Kind::kActivation);
    EXPECT_TRUE(b.ok()) << b.status().message();
    if (!b.ok()) return static_cast<void*>(nullptr);
    EXPECT_TRUE(dev.zero(b->data, bytes).ok());
    held.push_back(*b);
    return b->data;
  };
  auto* qkv = static_cast<uint16_t*>(take(2 * N * 3 * C));
  auto* out = static_cast<uint16_t*>(take(2 * N * C));
  auto* lse = static_cast<float*>(take(4 * B * NH * T));
  auto* dout = static_cast<float*>(take(4 * N * C));
  auto* dqkv = static_cast<uint16_t*>(take(2 * N * 3 * C));
  auto* dbias = static_cast<float*>(take(4 * 3 * C));
  auto* w = static_cast<uint16_t*>(take(2 * C * C));
  auto* prod = static_cast<float*>(take(4 * N * C));
  ASSERT_FALSE(HasFailure());
  ops.matmul_forward_bf16(prod, out, w, nullptr, N, C, C);
  ops.attention_forward_bf16(out, lse, qkv, B, T, C, NH);
  ops.attention_backward_bf16(dqkv, dbias, dout, out, qkv, lse, B, T, C, NH, true);
  ASSERT_TRUE(dev.synchronize().ok());
  ASSERT_TRUE(ops.status().ok()) << ops.status().message();
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  const size_t segments = dev.device_memory().reserved, used = total - free;
  const size_t outside = used > segments ? used - segments : 0;
  std::printf("GPU memory outside zoe's budget (context, cuBLASLt, cuDNN): %.1f MiB (GPU %zu MiB in use, zoe's "
              "segments %zu MiB)\n", outside / double(MiB), used / MiB, segments / MiB);
  EXPECT_LT(outside, size_t{3} << 30);
  for (Buffer& b : held) dev.free(b);
}

}  // namespace
}  // namespace zoe

#else  // !ZOE_HAVE_CUDA

TEST(CudaDevice, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)"; }

#endif

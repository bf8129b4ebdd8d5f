// NcclComm on one GPU and one rank (NCCL does not put two ranks on one GPU; nccl_comm_mpi_test
// covers several GPUs): the collectives move the right bytes in place and out of place, are
// ordered after the compute stream's earlier work and before its later work, reduce_scatter
// goes through sum_chunks (bitwise sum_chunks_in_order), the counters, the control traffic, and
// the staging buffer's life. Skips where there is no CUDA build or no GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "test_util.h"
#include "zoe/device.h"

#ifdef ZOE_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/gpu_info.h"
#include "gpu/nccl_comm.h"

namespace zoe {
namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, NcclComm not tested: " << why;
    auto d = make_cuda_device(local_gpu_index(), 4 * GiB, GiB);
    ASSERT_TRUE(d.ok()) << d.status().message();
    device_ = std::move(d.value());
    dev_ = static_cast<CudaDevice*>(device_.get());
    control_ = make_self_comm();
    auto c = make_nccl_comm(*control_, *dev_);
    ASSERT_TRUE(c.ok()) << c.status().message();
    comm_ = std::move(c.value());
  }
  void TearDown() override {
    if (comm_) comm_->set_device(nullptr);  // the staging buffer goes back before the device goes
    comm_.reset();
    if (dev_) {
      EXPECT_TRUE(dev_->synchronize().ok());
      for (Buffer& b : buffers_) dev_->free(b);
    }
  }
  void* alloc(size_t bytes) {
    auto r = dev_->alloc(bytes, Tier::kDevice, Kind::kGather);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return nullptr;
    buffers_.push_back(r.value());
    return r.value().data;
  }
  std::vector<uint8_t> fetch(const void* p, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_TRUE(dev_->download(out.data(), p, bytes).ok());
    return out;
  }
  uint64_t comm_bytes_booked() {
    return dev_->ledger().snapshot().bytes[static_cast<int>(Tier::kDevice)][static_cast<int>(Kind::kComm)];
  }

  std::unique_ptr<Device> device_;
  CudaDevice* dev_ = nullptr;
  std::unique_ptr<Comm> control_;
  std::unique_ptr<Comm> comm_;
  std::vector<Buffer> buffers_;
};

TEST_F(NcclCommTest, AllGatherInAndOutOfPlaceOrderedWithCompute) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
#ifdef ZOE_CUDA_EMU
  const size_t n = MiB;  // the emulation reports a missing wait when the work is queued, at any size
#else
  const size_t n = 64 * MiB;  // floats: enough kernel work for a missing wait to show
#endif
  std::vector<float> ones(n, 1.0f), twos(n, 2.0f);
  auto* src = static_cast<float*>(alloc(n * 4));
  auto* send = static_cast<float*>(alloc(n * 4));
  auto* recv = static_cast<float*>(alloc(n * 4));
  auto* out = static_cast<float*>(alloc(n * 4));
  ASSERT_TRUE(src && send && recv && out);
  ASSERT_TRUE(dev_->upload(src, ones.data(), n * 4).ok());
  ASSERT_TRUE(dev_->zero(send, n * 4).ok());
  ASSERT_TRUE(dev_->zero(recv, n * 4).ok());
  // compute writes send; the gather (comm stream) must see it; compute then reads recv.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(dev_->accumulate(send, DType::kF32, src, DType::kF32, n, false).ok());
  ASSERT_TRUE(comm_->all_gather(send, recv, n * 4).ok());
  ASSERT_TRUE(dev_->accumulate(out, DType::kF32, recv, DType::kF32, n, false).ok());
  ASSERT_TRUE(dev_->accumulate(out, DType::kF32, recv, DType::kF32, n, true).ok());
  std::vector<uint8_t> got = fetch(out, n * 4);
  EXPECT_EQ(std::memcmp(got.data(), twos.data(), n * 4), 0) << "out of place";
  // In place: send is this rank's slot of recv.
  ASSERT_TRUE(dev_->accumulate(recv, DType::kF32, out, DType::kF32, n, false).ok());  // recv = 2
  ASSERT_TRUE(comm_->all_gather(recv, recv, n * 4).ok());
  got = fetch(recv, n * 4);
  EXPECT_EQ(std::memcmp(got.data(), twos.data(), n * 4), 0) << "in place";
  EXPECT_TRUE(comm_->all_gather(send, recv, 0).ok());
  EXPECT_EQ(comm_->bytes_sent().total(), 0u);  // one rank puts nothing on the wire
}

TEST_F(NcclCommTest, ReduceScatterGoesThroughSumChunks) {
  const size_t count = 3 * MiB + 7;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const size_t bytes = count * dtype_size(t);
    std::vector<uint8_t> host(bytes);
    std::vector<float> v = test::random_floats(count, 11, -70000.f, 70000.f);  // past fp16's range too
    for (size_t i = 0; i < count; ++i) store_from_f32(host.data(), t, i, v[i]);
    const uint16_t snan16 = t == DType::kBF16 ? 0x7f81 : 0x7c01;  // a signalling NaN comes back quiet
    const uint32_t snan32 = 0x7fa00001u;
    if (t == DType::kF32) std::memcpy(host.data() + 4 * 5, &snan32, 4);
    else std::memcpy(host.data() + 2 * 5, &snan16, 2);
    std::vector<uint8_t> expect(bytes);
    sum_chunks_in_order(host.data(), 1, count, t, expect.data());
    void* send = alloc(bytes);
    void* recv = alloc(bytes);
    ASSERT_TRUE(send && recv);
    ASSERT_TRUE(dev_->upload(send, host.data(), bytes).ok());
    ASSERT_TRUE(comm_->reduce_scatter(send, recv, count, t).ok());
    EXPECT_TRUE(fetch(recv, bytes) == expect) << "out of place";
    ASSERT_TRUE(comm_->reduce_scatter(send, send, count, t).ok());  // recv aliases its own chunk
    EXPECT_TRUE(fetch(send, bytes) == expect) << "in place";
  }
  EXPECT_EQ(comm_->bytes_sent().total(), 0u);
  auto& nccl = static_cast<NcclComm&>(*comm_);
  EXPECT_GE(nccl.staging_bytes(), (3 * MiB + 7) * 4);  // grown to the largest and kept
  EXPECT_EQ(comm_bytes_booked(), nccl.staging_bytes());
}

// An engine reserves the staging of its largest reduction before it sizes its device reserve;
// a reduce_scatter within it allocates nothing more, and 0 gives it back.
TEST_F(NcclCommTest, ReservedStagingIsHeldUntilGivenBack) {
  auto& nccl = static_cast<NcclComm&>(*comm_);
  ASSERT_TRUE(comm_->reserve_staging(1000, DType::kBF16).ok());
  EXPECT_EQ(nccl.staging_bytes(), 1000u * 2 * comm_->size());
  EXPECT_EQ(comm_bytes_booked(), nccl.staging_bytes());
  void* buf = alloc(4096);
  ASSERT_NE(buf, nullptr);
  ASSERT_TRUE(dev_->zero(buf, 4096).ok());
  ASSERT_TRUE(comm_->reduce_scatter(buf, buf, 400, DType::kF32).ok());  // 1600 bytes a chunk: within
  EXPECT_EQ(nccl.staging_bytes(), 1000u * 2 * comm_->size());
  ASSERT_TRUE(comm_->reserve_staging(0, DType::kBF16).ok());
  EXPECT_EQ(nccl.staging_bytes(), 0u);
  EXPECT_EQ(comm_bytes_booked(), 0u);
}

TEST_F(NcclCommTest, StagingLivesWithTheDevice) {
  auto& nccl = static_cast<NcclComm&>(*comm_);
  void* buf = alloc(4096);
  ASSERT_NE(buf, nullptr);
  ASSERT_TRUE(dev_->zero(buf, 4096).ok());
  ASSERT_TRUE(comm_->reduce_scatter(buf, buf, 1024, DType::kF32).ok());
  EXPECT_GT(comm_bytes_booked(), 0u);
  comm_->set_device(nullptr);
  EXPECT_EQ(nccl.staging_bytes(), 0u);
  EXPECT_EQ(comm_bytes_booked(), 0u);
  Status s = comm_->reduce_scatter(buf, buf, 1024, DType::kF32);
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("set_device"), std::string::npos) << s.message();
  EXPECT_FALSE(comm_->all_gather(buf, buf, 16).ok());
  comm_->set_device(dev_);
  EXPECT_TRUE(comm_->reduce_scatter(buf, buf, 1024, DType::kF32).ok());
}

TEST_F(NcclCommTest, ControlTrafficGoesThroughTheControlComm) {
  double v[3] = {1.5, -2.0, 3.25};
  ASSERT_TRUE(comm_->all_reduce_sum(v, 3).ok());
  EXPECT_EQ(v[0], 1.5);
  EXPECT_EQ(v[2], 3.25);
  char msg[16] = "hello";
  ASSERT_TRUE(comm_->broadcast(msg, sizeof msg, 0).ok());
  EXPECT_EQ(comm_->bytes_sent().broadcast, sizeof msg);  // the payload, counted at the root
  EXPECT_EQ(comm_->bytes_sent().all_reduce, 0u);         // (N-1) copies: none for one rank
  EXPECT_TRUE(comm_->barrier().ok());
  EXPECT_TRUE(comm_->barrier_within(1.0));
  int mine = 7, all = 0;
  ASSERT_TRUE(comm_->gather_to_root(&mine, &all, sizeof mine).ok());
  EXPECT_EQ(all, 7);
  all = 0;
  ASSERT_TRUE(comm_->all_gather_control(&mine, &all, sizeof mine).ok());
  EXPECT_EQ(all, 7);
  comm_->reset_counters();
  EXPECT_EQ(comm_->bytes_sent().total(), 0u);
}

}  // namespace
}  // namespace zoe

#else  // !ZOE_HAVE_CUDA

TEST(NcclComm, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)"; }

#endif

// NcclComm between ranks, one GPU each: reduce_scatter is bitwise MpiComm's on the same bytes
// (the rank-order fp32 sum), all_gather gathers every rank's chunk, in place and out of place,
// and the byte counters are MpiComm's. Needs as many GPUs on the node as ranks (NCCL puts one
// rank on a GPU); skips otherwise, and where there is no CUDA build.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "mpi_test_main.h"
#include "test_util.h"
#include "zoe/device.h"

#ifdef ZOE_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/gpu_info.h"
#include "gpu/nccl_comm.h"

namespace zoe {
namespace {

Comm* g_mpi = nullptr;

// Rank r's send buffer: `size` chunks of `count` elements, values a function of (r, seed).
std::vector<uint8_t> send_of(int r, int size, size_t count, DType t, uint64_t seed) {
  std::vector<float> v = test::random_floats(count * size, seed * 131 + r, -3.f, 3.f);
  std::vector<uint8_t> b(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_from_f32(b.data(), t, i, v[i]);
  return b;
}

// Why the test cannot run here ("" if it can). Every rank takes the same decision: skip unless
// every rank has a GPU of its own.
std::string short_of_gpus(Comm& mpi) {
  std::string why;
  const size_t gpus = gpu::list_gpus(&why).size();
  double short_of = gpus < static_cast<size_t>(mpi.size()) ? 1 : 0;
#ifdef ZOE_CUDA_EMU
  short_of = gpus == 0;  // tools/cuda_emu: every process emulates a GPU of its own
#endif
  if (!mpi.all_reduce_sum(&short_of, 1).ok()) return "the all-reduce failed";
  if (short_of == 0) return "";
  return std::to_string(mpi.size()) + " ranks need as many GPUs, " + std::to_string(gpus) + " visible" +
         (gpus ? "" : ": " + why);
}

TEST(NcclCommMpi, CollectivesAreMpiCommsBitForBit) {
  Comm& mpi = *g_mpi;
  if (std::string why = short_of_gpus(mpi); !why.empty()) GTEST_SKIP() << why;
  mpi.reset_counters();

  auto d = make_cuda_device(local_gpu_index(), size_t{4} << 30, size_t{1} << 30);
  ASSERT_TRUE(d.ok()) << d.status().message();
  auto& dev = static_cast<CudaDevice&>(*d.value());
  auto c = make_nccl_comm(mpi, dev);
  ASSERT_TRUE(c.ok()) << c.status().message();
  Comm& nccl = *c.value();
  ASSERT_EQ(nccl.rank(), mpi.rank());
  ASSERT_EQ(nccl.size(), mpi.size());
  const int rank = mpi.rank(), size = mpi.size();
  std::vector<Buffer> held;
  auto alloc = [&](size_t bytes) {
    auto r = dev.alloc(bytes, Tier::kDevice, Kind::kGather);
    EXPECT_TRUE(r.ok()) << r.status().message();
    held.push_back(r.ok() ? r.value() : Buffer{});
    return held.back().data;
  };

  uint64_t seed = 1;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " count " + std::to_string(count));
      const size_t chunk = count * dtype_size(t);
      std::vector<uint8_t> send = send_of(rank, size, count, t, seed++);
      // MpiComm on host memory is the reference.
      std::vector<uint8_t> expect(chunk);
      ASSERT_TRUE(mpi.reduce_scatter(send.data(), expect.data(), count, t).ok());
      void* d_send = alloc(send.size());
      void* d_recv = alloc(chunk);
      ASSERT_TRUE(d_send && d_recv);
      ASSERT_TRUE(dev.upload(d_send, send.data(), send.size()).ok());
      ASSERT_TRUE(nccl.reduce_scatter(d_send, d_recv, count, t).ok());
      std::vector<uint8_t> got(chunk);
      ASSERT_TRUE(dev.download(got.data(), d_recv, chunk).ok());
      EXPECT_TRUE(got == expect) << "reduce_scatter out of place";
      // In place: recv is this rank's chunk of send.
      char* own = static_cast<char*>(d_send) + rank * chunk;
      ASSERT_TRUE(nccl.reduce_scatter(d_send, own, count, t).ok());
      ASSERT_TRUE(dev.download(got.data(), own, chunk).ok());
      EXPECT_TRUE(got == expect) << "reduce_scatter in place";

      // all_gather of each rank's reduced chunk, out of place then in place.
      std::vector<uint8_t> all(chunk * size);
      ASSERT_TRUE(mpi.all_gather(expect.data(), all.data(), chunk).ok());
      void* d_all = alloc(chunk * size);
      ASSERT_TRUE(d_all);
      ASSERT_TRUE(nccl.all_gather(d_recv, d_all, chunk).ok());
      std::vector<uint8_t> gathered(chunk * size);
      ASSERT_TRUE(dev.download(gathered.data(), d_all, gathered.size()).ok());
      EXPECT_TRUE(gathered == all) << "all_gather out of place";
      ASSERT_TRUE(dev.zero(d_all, chunk * size).ok());
      ASSERT_TRUE(dev.upload(static_cast<char*>(d_all) + rank * chunk, expect.data(), chunk).ok());
      ASSERT_TRUE(nccl.all_gather(static_cast<char*>(d_all) + rank * chunk, d_all, chunk).ok());
      ASSERT_TRUE(dev.download(gathered.data(), d_all, gathered.size()).ok());
      EXPECT_TRUE(gathered == all) << "all_gather in place";
    }
  // The same traffic was counted alike (NCCL ran each reduce_scatter twice and each gather twice).
  EXPECT_EQ(nccl.bytes_sent().reduce_scatter, 2 * mpi.bytes_sent().reduce_scatter);
  EXPECT_EQ(nccl.bytes_sent().all_gather, 2 * mpi.bytes_sent().all_gather);
  double v = rank + 1;
  ASSERT_TRUE(nccl.all_reduce_sum(&v, 1).ok());
  EXPECT_EQ(v, size * (size + 1) / 2.0);
  EXPECT_EQ(nccl.bytes_sent().all_reduce, static_cast<uint64_t>(size - 1) * sizeof(double));

  ASSERT_TRUE(dev.synchronize().ok());
  for (Buffer& b : held) dev.free(b);
  nccl.set_device(nullptr);
  c.value().reset();
}

// The duplicate (the engine's communication thread's) runs on a stream of its own, ordered by
// events only: rank 0's compute finishes while its reduce_scatter still waits for the other
// ranks, who join only after rank 0 saw that. Its results are the original's.
// zoe.nccl_reduce_scatter: ncclReduceScatter itself, in and out of place, fp32 and bf16, within
// rounding of the rank-order sum (against its largest value: fp32 1e-6, bf16 a rounding a hop); its
// duplicate sums the same way. At 3 ranks and more some rank's fp32 bits are not the rank-order
// sum's (NCCL's ring adds in another order): the option is what ran.
TEST(NcclCommMpi, NcclsOwnReduceScatterIsTheSumWithinItsRounding) {
  Comm& mpi = *g_mpi;
  if (std::string why = short_of_gpus(mpi); !why.empty()) GTEST_SKIP() << why;
  auto d = make_cuda_device(local_gpu_index(), size_t{4} << 30, size_t{1} << 30);
  ASSERT_TRUE(d.ok()) << d.status().message();
  auto& dev = static_cast<CudaDevice&>(*d.value());
  auto c = make_nccl_comm(mpi, dev, NcclComm::Sum::kNccl);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto dup = c.value()->duplicate();
  ASSERT_TRUE(dup.ok()) << dup.status().message();
  const int rank = mpi.rank(), size = mpi.size();
  const size_t count = 4096;
  uint64_t seed = 40;
  for (Comm* nccl : {c.value().get(), dup.value().get()})
    for (DType t : {DType::kF32, DType::kBF16})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + (in_place ? " in place" : " out of place") +
                     (nccl == dup.value().get() ? ", the duplicate" : ""));
        const size_t chunk = count * dtype_size(t);
        std::vector<uint8_t> send = send_of(rank, size, count, t, seed++), expect(chunk), got(chunk);
        ASSERT_TRUE(mpi.reduce_scatter(send.data(), expect.data(), count, t).ok());
        auto buf = dev.alloc(send.size() + chunk, Tier::kDevice, Kind::kGather);
        ASSERT_TRUE(buf.ok()) << buf.status().message();
        char* d_send = buf->as<char>();
        char* d_recv = in_place ? d_send + rank * chunk : d_send + send.size();
        ASSERT_TRUE(dev.upload(d_send, send.data(), send.size()).ok());
        ASSERT_TRUE(nccl->reduce_scatter(d_send, d_recv, count, t).ok());
        ASSERT_TRUE(dev.synchronize().ok());
        ASSERT_TRUE(dev.download(got.data(), d_recv, chunk).ok());
        dev.free(*buf);
        double worst = 0, largest = 1e-30;  // the error against the sum's largest value
        bool same_bits = true;
        for (size_t i = 0; i < count; ++i) {
          const double g = load_as_f32(got.data(), t, i), e = load_as_f32(expect.data(), t, i);
          worst = std::max(worst, std::fabs(g - e));
          largest = std::max(largest, std::fabs(e));
          same_bits = same_bits && std::memcmp(got.data() + i * dtype_size(t), expect.data() + i * dtype_size(t),
                                               dtype_size(t)) == 0;
        }
        EXPECT_LT(worst / largest, t == DType::kF32 ? 1e-6 : size * (1.0 / 256)) << "against the rank-order sum";
        double differ = same_bits ? 0 : 1;  // ranks whose chunk a ring summed in another order
        ASSERT_TRUE(mpi.all_reduce_sum(&differ, 1).ok());
        if (t == DType::kF32 && size >= 3) {
          EXPECT_GT(differ, 0) << "bitwise the rank-order sum on every rank: not NCCL's";
        }
      }
}

TEST(NcclCommMpi, ADuplicateRunsBesideComputeOrderedByEvents) {
  Comm& mpi = *g_mpi;
  if (std::string why = short_of_gpus(mpi); !why.empty()) GTEST_SKIP() << why;
  mpi.reset_counters();
  auto d = make_cuda_device(local_gpu_index(), size_t{1} << 30, size_t{1} << 28);
  ASSERT_TRUE(d.ok()) << d.status().message();
  auto& dev = static_cast<CudaDevice&>(*d.value());
  auto c = make_nccl_comm(mpi, dev);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto made = c.value()->duplicate();
  ASSERT_TRUE(made.ok()) << made.status().message();
  std::unique_ptr<Comm> dup = std::move(made.value());
  EXPECT_EQ(c.value()->tensor_stream(), Stream::kCompute);
  EXPECT_EQ(dup->tensor_stream(), Stream::kCommThread);
  EXPECT_EQ(dup->duplicate().status().code(), Code::kUnsupported);
  EXPECT_EQ(dup->rank(), mpi.rank());

  const int rank = mpi.rank(), size = mpi.size();
  const size_t count = 4099, chunk = count * 4;
  std::vector<uint8_t> send = send_of(rank, size, count, DType::kF32, 77), expect(chunk);
  ASSERT_TRUE(mpi.reduce_scatter(send.data(), expect.data(), count, DType::kF32).ok());
  auto b_send = dev.alloc(send.size(), Tier::kDevice, Kind::kGather);
  auto b_recv = dev.alloc(chunk, Tier::kDevice, Kind::kGather);
  auto b_other = dev.alloc(chunk, Tier::kDevice, Kind::kGather);
  ASSERT_TRUE(b_send.ok() && b_recv.ok() && b_other.ok());
  ASSERT_TRUE(dev.upload(b_send->data, send.data(), send.size()).ok());
  ASSERT_TRUE(dev.wait_on(Stream::kCommThread, dev.record(Stream::kCompute)).ok());
  auto reduce = [&] { return dup->reduce_scatter(b_send->data, b_recv->data, count, DType::kF32); };
  if (rank == 0) {
    ASSERT_TRUE(reduce().ok());
    const Event reduced = dev.record(Stream::kCommThread);
    ASSERT_TRUE(dev.zero(b_other->data, chunk).ok());
    const Event zeroed = dev.record(Stream::kCompute);
    // (A zero is milliseconds, on a GPU or the emulation's streams; its mutation waits the bound out.)
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!dev.done(zeroed) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(dev.done(zeroed)) << "compute waited for the duplicate's collective";
    EXPECT_FALSE(dev.done(reduced)) << "the reduce_scatter finished before the other ranks joined it";
  }
  ASSERT_TRUE(mpi.barrier().ok());
  if (rank != 0) {
    ASSERT_TRUE(reduce().ok());
  }
  // Readers wait for an event recorded on the duplicate's stream.
  ASSERT_TRUE(dev.wait_on(Stream::kCompute, dev.record(Stream::kCommThread)).ok());
  std::vector<uint8_t> got(chunk);
  ASSERT_TRUE(dev.download(got.data(), b_recv->data, chunk).ok());
  EXPECT_TRUE(got == expect) << "the duplicate's reduce_scatter";
  EXPECT_EQ(dup->bytes_sent().reduce_scatter, mpi.bytes_sent().reduce_scatter);

  ASSERT_TRUE(dev.synchronize().ok());
  for (auto* b : {&b_send, &b_recv, &b_other}) dev.free(b->value());
  dup->set_device(nullptr);
  dup.reset();
  c.value()->set_device(nullptr);
  c.value().reset();
}

}  // namespace
}  // namespace zoe

int main(int argc, char** argv) { return zoe::test::mpi_test_main(argc, argv, &zoe::g_mpi); }

#else  // !ZOE_HAVE_CUDA

TEST(NcclCommMpi, NotBuilt) { GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)"; }

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

#endif

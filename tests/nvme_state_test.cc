// State on the NVMe tier, below the optimizer's windows: a StateArray's units begin on blocks of
// its region (so a step moves each unit's blocks once, with no read-modify-write), and a
// ChunkLoad copies each piece to the device as soon as its read lands, before its fetch.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "comm/comm.h"
#include "common/round_up.h"
#include "cpu/cpu_device.h"
#include "engine_harness.h"
#include "nvme/pinned_pool.h"
#include "sched/stage3/chunk_load.h"
#include "sched/state_array.h"
#include "test_util.h"

namespace zoe {
namespace {

constexpr uint32_t kBlock = 4096;

struct Aligned {
  explicit Aligned(size_t n) : p(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)) {}
  ~Aligned() { std::free(p); }
  void* p;
};

std::vector<float> random_floats(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

Result<std::unique_ptr<NvmeStore>> open_store(const std::string& dir, CpuDevice& dev, PinnedPool* pool = nullptr);

// The direct-I/O alignment of swap files in `dir` (0 if a store cannot be opened there).
uint64_t dio_align(const std::string& dir) {
  CpuDevice dev{1 << 20, 1 << 20, /*strict=*/false};
  auto store = open_store(dir + "/probe", dev);
  if (!store.ok() || !store.value()->add_regions(std::vector<RegionSpec>{{"probe", kBlock}}).ok()) return 0;
  const uint64_t align = store.value()->segment_end_align(0);
  (void)store.value()->close();
  return align;
}

Result<std::unique_ptr<NvmeStore>> open_store(const std::string& dir, CpuDevice& dev, PinnedPool* pool) {
  NvmeStoreOptions o;
  o.nvme_path = dir;
  o.job = "state";
  o.block_size = kBlock;
  o.ledger = &dev.ledger();
  o.pool = pool;
  return NvmeStore::open(o);
}

// Units of 1500, 2048 and 700 fp32 elements (1024 a block) after a split at 100: each begins on
// a block of the region, part_end stops at each, a unit's transfers cover its own blocks only
// (its last one ends with its data), and rewriting a unit reads nothing back. The ledger books
// the elements, not the padding.
TEST(StateArrayOnNvme, UnitsBeginOnBlocksAndRewritesReadNothingBack) {
  const std::string dir = test::make_temp_dir("state-array");
  CpuDevice dev{1 << 20, 64 << 20, /*strict=*/false};
  auto opened = open_store(dir, dev);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  std::unique_ptr<NvmeStore> store = std::move(opened).value();
  const std::vector<int64_t> units = {0, 1600, 3648};
  const int64_t elems = 4348, split = 100;
  StateArray a;
  ASSERT_TRUE(a.allocate(dev, {Tier::kNvme, double(elems - split) / elems, store.get(), "x"}, elems, 4,
                         Kind::kExpAvg, units).ok());
  ASSERT_EQ(a.split(), split);
  EXPECT_EQ(store->region_bytes(0), 5 * kBlock);  // 2 + 2 + 1 blocks
  const RegionSpec spec = nvme_region("x", units, split, elems, 4, kBlock);
  EXPECT_EQ(spec.bytes, 5 * kBlock);
  EXPECT_EQ(spec.segment_ends, (std::vector<uint64_t>{6000, 2 * kBlock + 8192, 4 * kBlock + 2800}));
  EXPECT_EQ(dev.ledger().snapshot().persistent(Tier::kNvme), uint64_t(elems - split) * 4);
  EXPECT_EQ(a.part_end(0), 100);
  EXPECT_EQ(a.part_end(100), 1600);
  EXPECT_EQ(a.part_end(1599), 1600);
  EXPECT_EQ(a.part_end(1600), 3648);
  EXPECT_EQ(a.part_end(4000), elems);
  EXPECT_EQ(a.segment_begin(2700), 1600);
  EXPECT_EQ(a.block_of(100), 0u);
  EXPECT_EQ(a.block_of(1600), 2u);
  EXPECT_EQ(a.block_of(2624), 3u);
  EXPECT_EQ(a.block_of(3648), 4u);
  const WholeBlocks first = a.caller_blocks(100, 1500), second = a.caller_blocks(1600, 2048);
  EXPECT_EQ(first.first, 0u);
  EXPECT_EQ(first.count, 2u);  // block 1 holds the unit's last 476 elements and ends with them
  EXPECT_EQ(second.first, 2u);
  EXPECT_EQ(second.count, 2u);
  const int64_t seg[3][2] = {{100, 1500}, {1600, 2048}, {3648, 700}};
  // Each unit's last block stops at its data, aligned: the padding behind it never moves.
  const uint64_t align = store->segment_end_align(0);
  auto aligned = [&](uint64_t n) { return round_up(n, align); };
  const uint64_t moved = aligned(6000) + 8192 + aligned(2800);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    const std::vector<float> v = random_floats(elems, 10 + round);
    const NvmeStore::Traffic before = store->traffic();
    for (auto [e, n] : seg) {
      Aligned w(n * 4);
      std::memcpy(w.p, v.data() + e, n * 4);
      ASSERT_TRUE(a.wait(a.write_async(e, n, w.p)).ok());
    }
    const NvmeStore::Traffic wrote = store->traffic();
    EXPECT_EQ(wrote.read_bytes, before.read_bytes);  // the second round rewrites without reading
    EXPECT_EQ(wrote.written_bytes - before.written_bytes, moved);
    for (auto [e, n] : seg) {
      std::vector<float> back(n);
      ASSERT_TRUE(a.wait(a.read_async(e, n, back.data())).ok());
      EXPECT_EQ(std::memcmp(back.data(), v.data() + e, n * 4), 0);
    }
    EXPECT_EQ(store->traffic().read_bytes - wrote.read_bytes, moved);
  }
  a.release(dev);
  ASSERT_TRUE(store->close().ok());
  std::filesystem::remove_all(dir);
}

// One stage-3 step with everything on NVMe moves exactly its blocks: each unit's state (three
// fp32 arrays) read once, every array's units written once, each fetch's bf16 unit read once (the
// scheduler off: six fetches a step), and nothing else. A unit (4161 elements: 5 blocks of fp32,
// 3 of bf16, the last of each ending with its data) is cut into sub-groups and load windows of
// 2048 elements (the pinned pool of a 4.8 MB host budget holds three windows of that, and no room
// to read the next pass ahead, whose background reads would still be landing when the counts are
// taken). Of the block sums, the I/O thread makes or checks only the fetches'.
TEST(StateArrayOnNvme, AStepMovesEachUnitsBlocksOnce) {
  auto self = make_self_comm();
  const std::string dir = test::make_temp_dir("state-array-engine");
  Config c = test::with_nvme_offload(test::scheduler_off(test::mlp_config(3, DType::kBF16, 3, 64)), dir, 1.0);
  c.sub_group_size = 1 << 20;
  c.host_memory_budget = 4'800'000;
  std::vector<ZeroEngine::SchedStats> s;
  for (int steps : {3, 4}) {
    auto run = test::run_mlp(c, *self, steps);
    ASSERT_TRUE(run.ok()) << run.status().message();
    s.push_back(run->sched);
  }
  // The unit's last block ends with its data, rounded up to the file system's direct-I/O alignment.
  const uint64_t align = dio_align(dir);
  ASSERT_GT(align, 0u);
  auto aligned = [&](uint64_t n) { return round_up(n, align); };
  const uint64_t fp32_unit = aligned(4161 * 4), bf16_unit = aligned(4161 * 2);
  EXPECT_EQ(s[1].nvme_written_bytes - s[0].nvme_written_bytes, 3 * (3 * fp32_unit + bf16_unit));
  // A fetch the optimizer's write of the weights is still pending for takes them from that
  // write's memory (NvmeStore: forwarded), and how many do depends on timing, in each run apart.
  // Each fetch reads its unit in three transfers of one bf16 block each: two of 4096 bytes and
  // the last block's 130 bytes of data, every one a 4096-byte request of the device. So a run's
  // forwarded bytes say how many requests it saved (fewer than 31 short ones a run: 130 x 31 <
  // 4096), and the device reads plus those are exactly each unit's blocks once per use.
  ASSERT_EQ(bf16_unit, 3 * 4096u);
  auto saved = [](uint64_t forwarded) { return 4096 * (forwarded / 4096 + forwarded % 4096 / 130); };
  const uint64_t read = s[1].nvme_read_bytes - s[0].nvme_read_bytes;
  const uint64_t forwarded = s[1].nvme_forwarded_bytes - s[0].nvme_forwarded_bytes;
  EXPECT_EQ(read + saved(s[1].nvme_forwarded_bytes) - saved(s[0].nvme_forwarded_bytes),
            3 * 3 * fp32_unit + 6 * bf16_unit);
  // Adam hashes every block of the optimizer's windows, the bf16 weights' too (a unit's last
  // block ends with its data, so the windows cover each whole): the I/O thread hashes only what
  // the fetches read from the device, the weights' data; every fetched byte is hashed or forwarded.
  EXPECT_EQ(s[1].nvme_hashed_bytes - s[0].nvme_hashed_bytes + forwarded, 6 * 4161 * 2);
  EXPECT_GT(s[1].adam_hashed_blocks, s[0].adam_hashed_blocks);
  std::filesystem::remove_all(dir);
}

// A load of one unit in three pieces (windows of 2048 elements, two blocks of bf16): each piece's
// copy to the device is queued by the I/O thread as its read lands (strict: only the device
// touches its memory), with no call from the thread that needs the unit, and finish() then only
// waits; a load without a destination (staged) copies nothing until it finishes with one.
TEST(ChunkLoadTest, PiecesAreCopiedAsTheirReadsLand) {
  const std::string dir = test::make_temp_dir("chunk-load");
  CpuDevice dev{1 << 20, 64 << 20, /*strict=*/true};
  auto pool = PinnedPool::create({1 << 20, /*pin=*/false, &dev.ledger()});
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  ASSERT_TRUE(dev.register_host((*pool)->base(), (*pool)->capacity()).ok());
  auto opened = open_store(dir, dev, pool->get());
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  std::unique_ptr<NvmeStore> store = std::move(opened).value();
  const int64_t n = 5000;
  const std::vector<int64_t> units = {0, 300};
  StateArray a;
  ASSERT_TRUE(a.allocate(dev, {Tier::kNvme, 1.0, store.get(), "param"}, 300 + n, 2, Kind::kParam, units).ok());
  std::vector<uint16_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i * 7919);
  ASSERT_TRUE(a.wait(a.write_async(300, n, v.data())).ok());
  auto dst = dev.alloc(n * 2, Tier::kDevice, Kind::kParam);
  ASSERT_TRUE(dst.ok());
  for (bool staged : {false, true}) {
    SCOPED_TRACE(staged);
    ChunkLoad load(dev, pool->get(), a, 300, n, staged ? Buffer() : *dst, 0, 2048);
    ASSERT_TRUE(load.start().ok());
    ASSERT_TRUE(load.all_issued());
    if (staged) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_EQ(load.copies_issued(), 0);  // nowhere to copy to
      load.set_destination(*dst);
    } else {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (load.copies_issued() < 3 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_EQ(load.copies_issued(), 3);
    }
    ASSERT_TRUE(load.finish().ok());
    EXPECT_EQ(load.copies_issued(), 3);
    std::vector<uint16_t> back(n);
    ASSERT_TRUE(dev.download(back.data(), dst->data, n * 2).ok());
    EXPECT_EQ(back, v);
    ASSERT_TRUE(dev.zero(dst->data, n * 2).ok());
    ASSERT_TRUE(dev.synchronize().ok());
  }
  dev.free(*dst);
  a.release(dev);
  ASSERT_TRUE(store->close().ok());
  dev.unregister_host((*pool)->base());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zoe

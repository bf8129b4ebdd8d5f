// The NVMe tier's storage layer: byte-exact round trips at every size class, faults injected
// through the environment (each one clear Status, earlier data intact), a real full file system
// (a size-limited tmpfs), the directory lock, checksums, and the pinned pool's back-pressure.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/checksum.h"
#include "common/round_up.h"
#include "nvme/block_table.h"
#include "nvme/fault_injecting_env.h"
#include "nvme/nvme_store.h"
#include "nvme/pinned_pool.h"
#include "nvme/uring_queue.h"
#include "test_util.h"

namespace zoe {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kBlock = 64 << 10;  // small blocks: many of them in small files

TransferOptions in_background() {
  TransferOptions o;
  o.background = true;
  return o;
}

TransferOptions with_sums(std::shared_ptr<BlockSums> sums) {
  TransferOptions o;
  o.sums = std::move(sums);
  return o;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// Page-aligned heap memory, as an engine buffer would be.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~AlignedBuffer() { std::free(p); }
  uint8_t* p;
};

class NvmeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test::make_temp_dir("nvme");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override { fs::remove_all(root_); }

  NvmeStoreOptions options(bool checksums = true) const {
    NvmeStoreOptions o;
    o.nvme_path = root_;
    o.job = "test";
    o.block_size = kBlock;
    o.queue_depth = 4;
    o.checksums = checksums;
    return o;
  }

  std::unique_ptr<NvmeStore> open(const NvmeStoreOptions& o, std::vector<RegionSpec> regions) {
    auto r = NvmeStore::open(o, regions);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  std::string root_;
};

// ---- round trips ---------------------------------------------------------------------------

class NvmeRoundTrip : public NvmeStoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(NvmeRoundTrip, EverySizeClassIsByteExact) {
  const bool checksums = GetParam();
  // A pool just big enough for the bounce buffers and two one-block leases: transfers of many
  // blocks are larger than the pool.
  PinnedPoolOptions po;
  po.bytes = 6 * kBlock;
  auto pool = PinnedPool::create(po);
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  NvmeStoreOptions o = options(checksums);
  o.pool = pool.value().get();
  const uint64_t size = 3 * 1024 * 1024 + 123;  // an unaligned tail
  auto store = open(o, {{"state", size}});
  ASSERT_TRUE(store);
  EXPECT_EQ(store->region_bytes(0), size);

  std::vector<uint8_t> shadow(size, 0);  // what the region must hold
  struct Case {
    uint64_t offset, bytes;
  };
  const Case cases[] = {
      {0, 1},                         // one byte
      {5, 4000},                      // inside one page, unaligned both ends
      {4096, 4096},                   // one aligned page
      {kBlock - 7, 20},               // across a block boundary
      {kBlock, kBlock},               // exactly one block
      {3, 200 * 1024 + 1},            // many blocks, unaligned
      {size - 10, 10},                // the region's last bytes
      {0, size},                      // everything: tail not a multiple of the alignment
      {2 * kBlock, 5 * kBlock},       // aligned, many blocks
      {100, 33},
  };
  uint64_t seed = 1;
  AlignedBuffer aligned(size + 4096);
  for (const Case& c : cases) {
    SCOPED_TRACE("offset " + std::to_string(c.offset) + " bytes " + std::to_string(c.bytes));
    const std::vector<uint8_t> data = random_bytes(c.bytes, seed++);
    // Alternately from page-aligned memory (direct) and from an odd address (bounced).
    const bool odd = seed % 2 == 0;
    uint8_t* src = aligned.p + (odd ? 1 : 0);
    std::memcpy(src, data.data(), c.bytes);
    ASSERT_TRUE(store->write(0, c.offset, src, c.bytes).ok());
    std::memcpy(shadow.data() + c.offset, data.data(), c.bytes);
    std::vector<uint8_t> back(c.bytes + 1, 0xEE);  // never aligned on purpose: +1 below
    Status s = store->read(0, c.offset, back.data() + 1, c.bytes);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(0, std::memcmp(back.data() + 1, data.data(), c.bytes));
    std::memset(aligned.p, 0, c.bytes);
    ASSERT_TRUE(store->read(0, c.offset, aligned.p, c.bytes).ok());
    ASSERT_EQ(0, std::memcmp(aligned.p, data.data(), c.bytes));
  }
  // Nothing around any write was disturbed (the read-modify-writes of partial blocks).
  std::vector<uint8_t> all(size);
  ASSERT_TRUE(store->read(0, 0, all.data(), size).ok());
  EXPECT_TRUE(all == shadow);

  // Leases of the registered pool: the fixed-buffer path.
  auto lease = pool.value()->acquire(2 * kBlock);
  ASSERT_TRUE(lease.ok());
  const std::vector<uint8_t> data = random_bytes(2 * kBlock, 99);
  std::memcpy(lease.value().data(), data.data(), data.size());
  ASSERT_TRUE(store->write(0, kBlock, lease.value().data(), data.size()).ok());
  std::memset(lease.value().data(), 0, data.size());
  ASSERT_TRUE(store->read(0, kBlock, lease.value().data(), data.size()).ok());
  EXPECT_EQ(0, std::memcmp(lease.value().data(), data.data(), data.size()));
  lease.value().reset();
  EXPECT_TRUE(store->close().ok());
}

INSTANTIATE_TEST_SUITE_P(Checksums, NvmeRoundTrip, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "on" : "off"; });

// ---- block sums in the caller's hands ---------------------------------------------------------

TEST(WholeBlocks, OnlyBlocksTheRangeCoversWhole) {
  constexpr uint64_t B = 100, file = 1050;  // the file's last block is 50 bytes
  const BlockTable table(file, B, true);
  auto w = [&](uint64_t off, uint64_t n) {
    WholeBlocks x = table.whole(off, n);
    return std::pair<uint64_t, uint64_t>{x.first, x.count};
  };
  EXPECT_EQ(w(0, 100), std::make_pair(uint64_t{0}, uint64_t{1}));
  EXPECT_EQ(w(0, 99).second, 0u);
  EXPECT_EQ(w(1, 299), std::make_pair(uint64_t{1}, uint64_t{2}));
  EXPECT_EQ(w(150, 100).second, 0u);
  EXPECT_EQ(w(1000, 50), std::make_pair(uint64_t{10}, uint64_t{1}));  // up to the end of the file
  EXPECT_EQ(w(900, 149), std::make_pair(uint64_t{9}, uint64_t{1}));   // short of it
}

// Segments ending at 130 and 460 of a grid of 100, requests aligned to 20: block 1 is [100, 130)
// and its requests [100, 140); block 4 is [400, 460), requests too; [130, 200) and [460, 500)
// belong to no block.
TEST(WholeBlocks, ABlockStopsAtItsSegmentsEnd) {
  const std::vector<uint64_t> ends = {130, 460, 600};
  const BlockTable table(1000, 100, true, ends, 20);
  EXPECT_EQ(table.blocks(), 10u);
  EXPECT_EQ(table.end(0), 100u);
  EXPECT_EQ(table.end(1), 130u);
  EXPECT_EQ(table.io_end(1), 140u);
  EXPECT_EQ(table.end(2), 300u);
  EXPECT_EQ(table.end(4), 460u);
  EXPECT_EQ(table.io_end(4), 460u);
  EXPECT_EQ(table.end(5), 600u);  // a segment ending on the grid: no short block
  EXPECT_EQ(table.end(9), 1000u);
  EXPECT_EQ(table.whole(0, 129).count, 1u);  // block 1 not reached
  EXPECT_EQ(table.whole(0, 130).count, 2u);  // its data's end
  EXPECT_EQ(table.whole(200, 260).first, 2u);
  EXPECT_EQ(table.whole(200, 260).count, 3u);
  EXPECT_TRUE(table.in_blocks(0, 130));
  EXPECT_TRUE(table.in_blocks(200, 260));
  EXPECT_TRUE(table.in_blocks(460, 0));
  EXPECT_FALSE(table.in_blocks(0, 131));   // into the padding after 130
  EXPECT_FALSE(table.in_blocks(150, 10));  // inside it
  EXPECT_FALSE(table.in_blocks(199, 2));
  EXPECT_FALSE(table.in_blocks(0, 1000));
  EXPECT_FALSE(table.in_blocks(440, 30));
}

TEST_F(NvmeStoreTest, CallerSumsAreTheOnesRecordedAndReadsHandThemBack) {
  auto store = open(options(), {{"state", 10 * kBlock}});
  ASSERT_TRUE(store);
  AlignedBuffer buf(9 * kBlock);
  const std::vector<uint8_t> data = random_bytes(8 * kBlock, 7);
  std::memcpy(buf.p, data.data(), data.size());
  // Bytes [kBlock/2, 7.5 kBlock): blocks 1..6 are whole; the partial ends stay the store's.
  const uint64_t off = kBlock / 2, n = 7 * kBlock;
  const WholeBlocks w = store->caller_blocks(0, off, n);
  ASSERT_EQ(w.first, 1u);
  ASSERT_EQ(w.count, 6u);
  auto sums = std::make_shared<BlockSums>();
  sums->first = w.first;
  for (uint64_t k = 0; k < w.count; ++k) sums->sums.push_back(BlockTable::hash(buf.p + (k + 1) * kBlock - off, kBlock));
  const uint64_t good = sums->sums[2];
  sums->sums[2] ^= 1;  // block 3's sum is wrong on purpose: the store must take it as given
  ASSERT_TRUE(store->wait(store->write_async(0, off, buf.p, n, with_sums(sums))).ok());
  std::vector<uint8_t> back(n);
  Status s = store->read(0, off, back.data(), n);
  ASSERT_EQ(s.code(), Code::kCorrupt) << s.message();
  EXPECT_NE(s.message().find("checksum mismatch in block 3 "), std::string::npos) << s.message();

  // A read with the caller's sums: the store checks only the partial blocks and hands back the
  // recorded sums of the whole ones (block 3's wrong one too), with what was never written marked.
  sums->sums[2] = good;
  ASSERT_TRUE(store->wait(store->write_async(0, off, buf.p, n, with_sums(sums))).ok());
  auto got = std::make_shared<BlockSums>();
  const WholeBlocks r = store->caller_blocks(0, 0, 10 * kBlock);
  ASSERT_EQ(r.count, 10u);
  got->first = r.first;
  got->sums.assign(r.count, 0);
  got->check.assign(r.count, 0);
  std::vector<uint8_t> all(10 * kBlock);
  ASSERT_TRUE(store->wait(store->read_async(0, 0, all.data(), all.size(), with_sums(got))).ok());
  for (uint64_t k = 0; k < r.count; ++k) {
    SCOPED_TRACE(k);
    const bool written = k <= 7;  // 0 and 7 by the partial ends; 8 and 9 never
    EXPECT_EQ(got->check[k], written);
    if (written) {
      EXPECT_TRUE(store->check_sum(0, k, got->sums[k], BlockTable::hash(all.data() + k * kBlock, kBlock)).ok());
    }
  }
  // Bad data in a caller-checked block is the caller's to find; check_sum words it as the store does.
  all[3 * kBlock + 5] ^= 0x10;
  Status bad = store->check_sum(0, 3, got->sums[3], BlockTable::hash(all.data() + 3 * kBlock, kBlock));
  ASSERT_EQ(bad.code(), Code::kCorrupt);
  EXPECT_NE(bad.message().find(store->region_path(0) + ": checksum mismatch in block 3 (bytes " +
                               std::to_string(3 * kBlock) + ".." + std::to_string(4 * kBlock - 1) + ")"),
            std::string::npos)
      << bad.message();
  // Sums that do not match the range's whole blocks are refused before anything moves.
  auto wrong = std::make_shared<BlockSums>(*got);
  wrong->first = 2;
  EXPECT_EQ(store->wait(store->read_async(0, 0, all.data(), all.size(), with_sums(wrong))).code(), Code::kInvalidInput);
  wrong = std::make_shared<BlockSums>(*got);
  wrong->check.clear();  // a read needs room for the checks
  EXPECT_EQ(store->wait(store->read_async(0, 0, all.data(), all.size(), with_sums(wrong))).code(), Code::kInvalidInput);
  EXPECT_TRUE(store->close().ok());
}

// A block never written reads as zeros without a request (the fresh file holds zeros there; the
// file system would only zero-fill it, yet count a device read): only written blocks reach the
// kernel, and the store counts the rest apart. Whole and partial reads, with and without sums.
TEST_F(NvmeStoreTest, NeverWrittenBlocksReadAsZerosWithoutARequest) {
  for (bool checksums : {false, true}) {
    SCOPED_TRACE(checksums);
    FaultInjectingEnv env(NvmeEnv::Default());
    NvmeStoreOptions o = options(checksums);
    o.env = &env;
    auto store = open(o, {{"state", 4 * kBlock}});
    ASSERT_TRUE(store);
    const std::vector<uint8_t> data = random_bytes(kBlock, 11);
    ASSERT_TRUE(store->write(0, kBlock, data.data(), kBlock).ok());  // block 1 only
    AlignedBuffer all(4 * kBlock);
    std::memset(all.p, 0xAB, 4 * kBlock);
    ASSERT_TRUE(store->read(0, 0, all.p, 4 * kBlock).ok());
    EXPECT_EQ(env.completed_bytes(IoOp::kRead), kBlock) << "only the written block is read";
    EXPECT_EQ(0, std::memcmp(all.p + kBlock, data.data(), kBlock));
    for (uint64_t i : {uint64_t{0}, 2 * uint64_t{kBlock}, 3 * uint64_t{kBlock}})
      EXPECT_EQ(std::count(all.p + i, all.p + i + kBlock, 0), kBlock) << "block at " << i;
    std::vector<uint8_t> part(1000, 0xAB);  // unaligned, inside never-written block 2
    ASSERT_TRUE(store->read(0, 2 * kBlock + 100, part.data(), part.size()).ok());
    EXPECT_EQ(std::count(part.begin(), part.end(), 0), 1000);
    EXPECT_EQ(env.completed_bytes(IoOp::kRead), kBlock);
    const NvmeStore::Traffic t = store->traffic();
    EXPECT_EQ(t.read_bytes, kBlock);
    EXPECT_EQ(t.zero_filled_bytes, 3 * uint64_t{kBlock} + 1000);
    EXPECT_TRUE(store->close().ok());
  }
}

// A write that says the rest of its last block is padding (pad_last_block) is not read back
// first: the device reads nothing, the block reads back as the data and zeros, and its sum
// verifies. Without that word the same write reads the written block first (read-modify-write).
TEST_F(NvmeStoreTest, APaddedWriteIsNotReadBackFirst) {
  auto store = open(options(), {{"state", 4 * kBlock}});
  ASSERT_TRUE(store);
  AlignedBuffer buf(2 * kBlock);
  std::vector<uint8_t> data = random_bytes(2 * kBlock, 3);
  std::memcpy(buf.p, data.data(), data.size());
  ASSERT_TRUE(store->write(0, 0, buf.p, 2 * kBlock).ok());  // block 1 is written: a partial write must care
  for (bool pad : {true, false}) {
    SCOPED_TRACE(pad);
    const uint64_t n = kBlock + kBlock / 3;  // block 0 whole, block 1 in part
    data = random_bytes(n, pad ? 4 : 5);
    std::memcpy(buf.p, data.data(), n);
    const NvmeStore::Traffic before = store->traffic();
    TransferOptions o;
    o.pad_last_block = pad;
    ASSERT_TRUE(store->wait(store->write_async(0, 0, buf.p, n, o)).ok());
    const NvmeStore::Traffic after = store->traffic();
    EXPECT_EQ(after.read_bytes - before.read_bytes, pad ? 0 : kBlock);
    EXPECT_EQ(after.written_bytes - before.written_bytes, 2 * kBlock);
    std::vector<uint8_t> back(2 * kBlock);
    ASSERT_TRUE(store->read(0, 0, back.data(), back.size()).ok());  // every sum verifies
    EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin()));
    // Padded: zeros behind the data. Read back first: what the padded write left there.
    EXPECT_TRUE(std::all_of(back.begin() + n, back.end(), [](uint8_t b) { return b == 0; }));
  }
  EXPECT_TRUE(store->close().ok());
}

// Two segments: [0, 1.3 blocks) and [2 blocks, 3.5 blocks), each padded to the next block. Each
// one's last block stops at its data (its requests at the next aligned offset), so writing and
// reading both moves 1.3 + 1.5 blocks' worth (aligned), not 4 blocks; the padding cannot be
// reached; and a flipped byte in a short block is still caught.
TEST_F(NvmeStoreTest, ABlockEndsWithItsSegmentsData) {
  const uint64_t a = kBlock + 3 * kBlock / 10, b = 3 * kBlock / 2;
  RegionSpec spec{"state", 4 * kBlock, {a, 2 * kBlock + b}};
  auto store = open(options(), {spec});
  ASSERT_TRUE(store);
  const uint64_t align = store->segment_end_align(0);
  auto aligned = [&](uint64_t n) { return round_up(n, align); };
  AlignedBuffer buf(2 * kBlock);
  const std::vector<uint8_t> x = random_bytes(a, 1), y = random_bytes(b, 2);
  TransferOptions pad;
  pad.pad_last_block = true;
  const NvmeStore::Traffic t0 = store->traffic();
  std::memcpy(buf.p, x.data(), a);
  ASSERT_TRUE(store->wait(store->write_async(0, 0, buf.p, a, pad)).ok());
  std::memcpy(buf.p, y.data(), b);
  ASSERT_TRUE(store->wait(store->write_async(0, 2 * kBlock, buf.p, b, pad)).ok());
  const NvmeStore::Traffic t1 = store->traffic();
  EXPECT_EQ(t1.written_bytes - t0.written_bytes, aligned(a) + aligned(b));
  EXPECT_EQ(t1.read_bytes, t0.read_bytes);
  std::vector<uint8_t> back(b);
  ASSERT_TRUE(store->read(0, 2 * kBlock, back.data(), b).ok());
  EXPECT_TRUE(back == y);
  back.resize(a);
  ASSERT_TRUE(store->read(0, 0, back.data(), a).ok());
  EXPECT_TRUE(back == x);
  EXPECT_EQ(store->traffic().read_bytes - t1.read_bytes, aligned(a) + aligned(b));
  // A range that reaches a segment's end covers its short block whole: the caller may hash it.
  EXPECT_EQ(store->caller_blocks(0, 0, a).count, 2u);
  EXPECT_EQ(store->caller_blocks(0, 0, a - 1).count, 1u);
  EXPECT_EQ(store->caller_blocks(0, 2 * kBlock, b).count, 2u);
  // Past a segment's data into its padding: refused, naming the region.
  Status s = store->read(0, a, back.data(), kBlock);
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("into its padding"), std::string::npos) << s.message();
  EXPECT_EQ(store->write(0, 0, buf.p, 2 * kBlock).code(), Code::kInvalidInput);
  // A flipped byte in the short block 1.
  int fd = ::open(store->region_path(0).c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const uint8_t flipped = x[kBlock + 5] ^ 0x10;
  ASSERT_EQ(::pwrite(fd, &flipped, 1, kBlock + 5), 1);
  ASSERT_EQ(::fdatasync(fd), 0);
  ::close(fd);
  s = store->read(0, 0, back.data(), a);
  ASSERT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find(fmt::format("block 1 (bytes {}..{})", kBlock, a - 1)),
            std::string::npos) << s.message();
  EXPECT_TRUE(store->close().ok());
}

TEST_F(NvmeStoreTest, SegmentEndsThatShareABlockAreRefused) {
  for (std::vector<uint64_t> ends : {std::vector<uint64_t>{100, 200}, {2 * kBlock, kBlock}, {5 * kBlock}}) {
    auto r = NvmeStore::open(options(), std::vector<RegionSpec>{{"state", 4 * kBlock, ends}});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidInput);
    EXPECT_NE(r.status().message().find("region 'state': segment end"), std::string::npos) << r.status().message();
  }
}

TEST_F(NvmeStoreTest, AsyncTransfersOnOneBlockApplyInSubmissionOrder) {
  auto store = open(options(), {{"a", 4 * kBlock}, {"b", 10000}});
  ASSERT_TRUE(store);
  const std::vector<uint8_t> x = random_bytes(3 * kBlock, 1), y = random_bytes(3 * kBlock, 2);
  // Overlapping, unaligned, all in flight at once: the later one wins where they overlap.
  std::vector<Ticket> t;
  t.push_back(store->write_async(0, 10, x.data(), x.size()));
  t.push_back(store->write_async(0, 1000, y.data(), y.size()));
  t.push_back(store->write_async(1, 0, x.data(), 10000));
  std::vector<uint8_t> back(4 * kBlock), back_b(10000);
  t.push_back(store->read_async(0, 0, back.data(), back.size()));
  t.push_back(store->read_async(1, 0, back_b.data(), back_b.size()));
  for (const Ticket& k : t) ASSERT_TRUE(store->wait(k).ok());
  std::vector<uint8_t> want(4 * kBlock, 0);
  std::memcpy(want.data() + 10, x.data(), x.size());
  std::memcpy(want.data() + 1000, y.data(), y.size());
  EXPECT_TRUE(back == want);
  EXPECT_EQ(0, std::memcmp(back_b.data(), x.data(), 10000));
  EXPECT_TRUE(store->wait(t[0]).ok());  // waiting twice is fine
}

// Background transfers (the optimizer's read-ahead and state write-backs) keep their order among
// themselves and let foreground ones go first; everything still lands byte-exact.
TEST_F(NvmeStoreTest, BackgroundTransfersKeepTheirOrderAndYieldToTheForeground) {
  auto store = open(options(), {{"state", 16 * kBlock}, {"param", 4 * kBlock}});
  ASSERT_TRUE(store);
  const std::vector<uint8_t> x = random_bytes(16 * kBlock, 3), y = random_bytes(16 * kBlock, 4),
                             p = random_bytes(4 * kBlock, 5);
  std::vector<uint8_t> mid(16 * kBlock), last(16 * kBlock), param(4 * kBlock);
  std::vector<Ticket> bg = {store->write_async(0, 0, x.data(), x.size(), in_background()),
                            store->read_async(0, 0, mid.data(), mid.size(), in_background()),
                            store->write_async(0, 7, y.data(), y.size() - 7, in_background()),
                            store->read_async(0, 0, last.data(), last.size(), in_background())};
  // Foreground, submitted later, on other blocks: done first or not, it is exact.
  ASSERT_TRUE(store->write(1, 0, p.data(), p.size()).ok());
  ASSERT_TRUE(store->read(1, 0, param.data(), param.size()).ok());
  EXPECT_TRUE(param == p);
  for (const Ticket& t : bg) ASSERT_TRUE(store->wait(t).ok());
  EXPECT_TRUE(mid == x);  // the read saw the write before it, not the one after
  std::vector<uint8_t> want = x;
  std::memcpy(want.data() + 7, y.data(), y.size() - 7);
  EXPECT_TRUE(last == want);
}

// Background blocks go out a batch at a time, each batch handed to the kernel in one submission
// (neighbouring blocks then merge into one disk request: one VM exit instead of one per block);
// foreground blocks fill the whole queue.
TEST_F(NvmeStoreTest, BackgroundBlocksGoOutInBatchesTheKernelCanMerge) {
  FaultInjectingEnv env(NvmeEnv::Default());
  NvmeStoreOptions o = options();
  o.env = &env;
  o.queue_depth = 8;
  auto store = open(o, {{"state", 16 * kBlock}});
  ASSERT_TRUE(store);
  const std::vector<uint8_t> x = random_bytes(16 * kBlock, 6);
  AlignedBuffer src(x.size()), back(x.size());  // aligned: no bounce buffer limits the batches
  std::memcpy(src.p, x.data(), x.size());
  ASSERT_TRUE(store->wait(store->write_async(0, 0, src.p, x.size(), in_background())).ok());
  EXPECT_EQ(env.requests(IoOp::kWrite), 16);
  // Half the queue (4 MiB of 64 KiB blocks would be more), not one block at a time.
  EXPECT_EQ(env.largest_submission(IoOp::kWrite), 4);
  ASSERT_TRUE(store->read(0, 0, back.p, x.size()).ok());
  EXPECT_EQ(0, std::memcmp(back.p, x.data(), x.size()));
  EXPECT_EQ(env.largest_submission(IoOp::kRead), 8);
}

// Background batches at 1 MiB blocks and depth 32, with writes held back from the device: what
// the store keeps in flight is what reaches the (fault-injecting) queue.
class NvmeBackgroundTest : public NvmeStoreTest {
 protected:
  static constexpr uint64_t kMiB = 1 << 20;
  // A store of `mib` MiB whose source bytes are src (page-aligned: no bounce buffer limits it).
  void SetUpStore(uint64_t mib) {
    NvmeStoreOptions o = options();
    o.env = &env_;
    o.block_size = kMiB;
    o.queue_depth = 32;
    store_ = open(o, {{"state", mib * kMiB}});
    ASSERT_TRUE(store_);
    data_ = random_bytes(mib * kMiB, mib);
    src_ = std::make_unique<AlignedBuffer>(data_.size());
    std::memcpy(src_->p, data_.data(), data_.size());
    env_.hold(IoOp::kWrite, true);
  }
  // The write requests in flight once they stop growing (at least `want`, or 1 s passed).
  int settled_writes(int want) {
    for (int i = 0; i < 200 && env_.requests(IoOp::kWrite) < want; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // and nothing more comes
    return env_.requests(IoOp::kWrite);
  }
  // Releases the writes; every ticket completes and the region reads back exact.
  void release_and_check(std::initializer_list<Ticket> tickets) {
    env_.hold(IoOp::kWrite, false);
    for (const Ticket& t : tickets) ASSERT_TRUE(store_->wait(t).ok());
    AlignedBuffer back(data_.size());
    ASSERT_TRUE(store_->read(0, 0, back.p, data_.size()).ok());
    EXPECT_EQ(0, std::memcmp(back.p, data_.data(), data_.size()));
  }

  FaultInjectingEnv env_{NvmeEnv::Default()};
  std::unique_ptr<NvmeStore> store_;
  std::vector<uint8_t> data_;
  std::unique_ptr<AlignedBuffer> src_;
};

// Background batches follow each other without the queue draining in between: four batches
// (16 MiB) go out at once while the device holds them, no more.
TEST_F(NvmeBackgroundTest, BatchesOverlapUpToTheirShareOfTheQueue) {
  ASSERT_NO_FATAL_FAILURE(SetUpStore(32));
  Ticket t = store_->write_async(0, 0, src_->p, data_.size(), in_background());
  EXPECT_EQ(settled_writes(16), 16) << "background requests in flight while the device holds them";
  release_and_check({t});
  EXPECT_EQ(env_.requests(IoOp::kWrite), 32);
}

// ... and they start beside a foreground transfer's last requests, not only once the queue is
// empty: with 8 foreground writes held in flight, 16 background ones join them.
TEST_F(NvmeBackgroundTest, BatchesStartBesideForegroundRequestsInFlight) {
  ASSERT_NO_FATAL_FAILURE(SetUpStore(40));
  Ticket fg = store_->write_async(0, 0, src_->p, 8 * kMiB);
  Ticket bg = store_->write_async(0, 8 * kMiB, src_->p + 8 * kMiB, 32 * kMiB, in_background());
  EXPECT_EQ(settled_writes(24), 8 + 16) << "foreground and background requests in flight together";
  release_and_check({fg, bg});
}

// wait_idle() returns only once every transfer submitted has completed; traffic() then counts
// all of them (the report's final NVMe bytes rest on it).
TEST_F(NvmeStoreTest, WaitIdleReturnsOnceEveryTransferSubmittedHasCompleted) {
  FaultInjectingEnv env(NvmeEnv::Default());
  NvmeStoreOptions o = options();
  o.env = &env;
  const std::vector<uint8_t> x = random_bytes(2 * kBlock, 21);
  auto store = open(o, {{"a", 4 * kBlock}});
  ASSERT_TRUE(store);
  env.hold(IoOp::kWrite, true);
  Ticket w = store->write_async(0, 0, x.data(), x.size());
  std::atomic<bool> idle{false};
  std::thread waiter([&] {
    store->wait_idle();
    idle.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(idle.load()) << "wait_idle returned while a write was held back from the device";
  env.hold(IoOp::kWrite, false);
  waiter.join();
  EXPECT_TRUE(store->ready(w));
  EXPECT_TRUE(store->wait(w).ok());
  EXPECT_EQ(store->traffic().written_bytes, x.size());
  store->wait_idle();  // nothing in flight: at once
}

// A read whose bytes pending writes cover (each byte from the newest write holding it) is served
// from those writes' memory: it completes while the writes are held back from the device, and
// reads and hashes nothing. A read they cover only in part waits for them and reads the device;
// once a write is done, reads of its bytes go to the device again.
TEST_F(NvmeStoreTest, AReadOfAPendingWriteIsServedFromItsMemory) {
  FaultInjectingEnv env(NvmeEnv::Default());
  NvmeStoreOptions o = options();
  o.env = &env;
  o.queue_depth = 8;  // room for the held writes' blocks and the read of the other region
  // Every buffer outlives the store, whose close waits for the transfers even when a check fails.
  const std::vector<uint8_t> x = random_bytes(3 * kBlock + 100, 12), y = random_bytes(200, 13),
                             z = random_bytes(kBlock - 10, 14);
  std::vector<uint8_t> early(kBlock + 7), whole(kBlock), newer(100), other(100, 0xee), three(kBlock + 200),
      across(300);
  auto store = open(o, {{"a", 6 * kBlock}, {"b", 4 * kBlock}});
  ASSERT_TRUE(store);
  env.hold(IoOp::kWrite, true);
  struct Unhold {  // before the store closes, which waits for the writes, even when a check fails
    FaultInjectingEnv& e;
    ~Unhold() { e.hold(IoOp::kWrite, false); }
  } unhold{env};
  std::vector<Ticket> writes = {store->write_async(0, 10, x.data(), x.size()),
                                store->write_async(0, 4 * kBlock + 100, y.data(), y.size())};
  // Done while the writes are held (a read that waited for them would never be), so a missing
  // forward fails here instead of hanging.
  auto done_now = [&](const Ticket& t) {
    for (int i = 0; i < 5000 && !store->ready(t); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return store->ready(t) && store->wait(t).ok();
  };
  // Inside the first write only, unaligned, over a block boundary: forwarded from x.
  ASSERT_TRUE(done_now(store->read_async(0, 500, early.data(), early.size())));
  EXPECT_EQ(0, std::memcmp(early.data(), x.data() + 490, early.size()));
  // A whole block with the caller's sums: no device copy, so nothing for the caller to check.
  const WholeBlocks w = store->caller_blocks(0, kBlock, kBlock);
  ASSERT_EQ(w.count, 1u);
  auto sums = std::make_shared<BlockSums>();
  sums->first = w.first;
  sums->sums = {7};
  sums->check = {1};
  ASSERT_TRUE(done_now(store->read_async(0, kBlock, whole.data(), kBlock, with_sums(sums))));
  EXPECT_EQ(0, std::memcmp(whole.data(), x.data() + kBlock - 10, kBlock));
  EXPECT_EQ(sums->check[0], 0);
  // Inside the newer write: its bytes.
  ASSERT_TRUE(done_now(store->read_async(0, 4 * kBlock + 150, newer.data(), newer.size())));
  EXPECT_EQ(0, std::memcmp(newer.data(), y.data() + 50, newer.size()));
  // Another region's bytes are not the write's.
  ASSERT_TRUE(store->read(1, 500, other.data(), other.size()).ok());
  EXPECT_EQ(other, std::vector<uint8_t>(100, 0));
  // Filling the gap between the two: a read across all three takes each byte from its write.
  writes.push_back(store->write_async(0, 3 * kBlock + 110, z.data(), z.size()));
  ASSERT_TRUE(done_now(store->read_async(0, 3 * kBlock, three.data(), three.size())));
  EXPECT_EQ(0, std::memcmp(three.data(), x.data() + 3 * kBlock - 10, 110));
  EXPECT_EQ(0, std::memcmp(three.data() + 110, z.data(), z.size()));
  EXPECT_EQ(0, std::memcmp(three.data() + kBlock + 100, y.data(), 100));
  const uint64_t device_reads = env.requests(IoOp::kRead);
  const uint64_t forwarded = early.size() + kBlock + newer.size() + three.size();
  EXPECT_EQ(store->traffic().forwarded_bytes, forwarded);
  // Across the end of the newer write: it covers only part, so the read waits for both writes.
  Ticket r = store->read_async(0, 4 * kBlock + 150, across.data(), across.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(store->ready(r));
  EXPECT_FALSE(store->ready(writes[0]));  // held: nothing reached the file yet
  env.hold(IoOp::kWrite, false);
  for (const Ticket& t : writes) ASSERT_TRUE(store->wait(t).ok());
  ASSERT_TRUE(store->wait(r).ok());
  std::vector<uint8_t> want(6 * kBlock, 0);
  std::memcpy(want.data() + 10, x.data(), x.size());
  std::memcpy(want.data() + 4 * kBlock + 100, y.data(), y.size());
  std::memcpy(want.data() + 3 * kBlock + 110, z.data(), z.size());
  EXPECT_EQ(0, std::memcmp(across.data(), want.data() + 4 * kBlock + 150, across.size()));
  EXPECT_GT(env.requests(IoOp::kRead), device_reads);
  // Written: the same read as the first goes to the device now.
  const uint64_t after_writes = env.requests(IoOp::kRead);
  std::fill(early.begin(), early.end(), 0);
  ASSERT_TRUE(store->read(0, 500, early.data(), early.size()).ok());
  EXPECT_EQ(0, std::memcmp(early.data(), want.data() + 500, early.size()));
  EXPECT_GT(env.requests(IoOp::kRead), after_writes);
  EXPECT_EQ(store->traffic().forwarded_bytes, forwarded);
}

TEST_F(NvmeStoreTest, OneBounceBufferAndAnUnpinnedPoolStillMoveEverything) {
  // Every block of an odd address needs the single bounce buffer in turn; the pool is plain
  // memory, so nothing is registered with io_uring.
  NvmeStoreOptions o = options();
  o.bounce_buffers = 1;
  o.pin_memory = false;
  auto store = open(o, {{"a", 10 * kBlock + 1}});
  ASSERT_TRUE(store);
  const std::vector<uint8_t> d = random_bytes(10 * kBlock + 1, 4);
  std::vector<uint8_t> src(d.size() + 1), back(d.size() + 1);
  std::memcpy(src.data() + 1, d.data(), d.size());
  Ticket w = store->write_async(0, 0, src.data() + 1, d.size());
  Ticket r = store->read_async(0, 0, back.data() + 1, d.size());  // ordered after the write, block by block
  ASSERT_TRUE(store->wait(w).ok());
  ASSERT_TRUE(store->wait(r).ok());
  EXPECT_EQ(0, std::memcmp(back.data() + 1, d.data(), d.size()));
}

TEST_F(NvmeStoreTest, RegionsAddedLaterWorkLikeTheFirst) {
  // The ring is single-issuer: registering the new file happens on the I/O thread.
  auto store = open(options(), {{"a", kBlock}});
  ASSERT_TRUE(store);
  const std::vector<RegionSpec> more = {{"b", 3 * kBlock}, {"c", 7}};
  ASSERT_TRUE(store->add_regions(more).ok());
  EXPECT_EQ(store->region("c").value(), 2);
  const std::vector<uint8_t> d = random_bytes(3 * kBlock, 8);
  ASSERT_TRUE(store->write(1, 0, d.data(), d.size()).ok());
  ASSERT_TRUE(store->write(2, 0, d.data(), 7).ok());
  std::vector<uint8_t> back(d.size());
  ASSERT_TRUE(store->read(1, 0, back.data(), back.size()).ok());
  EXPECT_TRUE(back == d);
  ASSERT_TRUE(store->read(2, 0, back.data(), 7).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), d.data(), 7));
  EXPECT_EQ(store->add_regions(more).code(), Code::kInvalidInput);  // names are unique
}

TEST(UringQueueTest, SingleIssuerRingWhereTheKernelHasIt) {
  auto q = UringQueue::create(4);
  ASSERT_TRUE(q.ok()) << q.status().message();
  struct utsname u;
  ASSERT_EQ(::uname(&u), 0);
  int major = 0, minor = 0;
  std::sscanf(u.release, "%d.%d", &major, &minor);
  if (major > 6 || (major == 6 && minor >= 1)) {
    EXPECT_TRUE(q.value()->single_issuer()) << u.release;
  }
  EXPECT_TRUE(q.value()->attach_thread().ok());
}

TEST_F(NvmeStoreTest, RangesPastTheEndAreRefused) {
  auto store = open(options(), {{"a", 5000}});
  ASSERT_TRUE(store);
  std::vector<uint8_t> buf(6000);
  Status s = store->read(0, 1000, buf.data(), 4001);
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("past the end of region 'a'"), std::string::npos) << s.message();
  EXPECT_FALSE(store->write(1, 0, buf.data(), 1).ok());
  EXPECT_TRUE(store->write(0, 5000, buf.data(), 0).ok());
}

TEST_F(NvmeStoreTest, FilesAreRemovedOnCloseAndTheLockReleased) {
  auto store = open(options(), {{"master", 100000}, {"exp_avg", 5}});
  ASSERT_TRUE(store);
  const std::string dir = store->dir();
  EXPECT_EQ(dir, root_ + "/zoe-test-rank0");
  EXPECT_TRUE(fs::exists(dir + "/master.swap"));
  // Preallocated to the direct-I/O alignment (statx says which: 512 or 4096 here): the logical
  // size is the store's, the file's is whole aligned units.
  const uint64_t file = fs::file_size(dir + "/master.swap");
  EXPECT_TRUE(file >= 100000 && file < 100000 + 4096 && file % 512 == 0) << file;
  EXPECT_TRUE(store->close().ok());
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_FALSE(store->write(0, 0, "x", 1).ok());  // closed
  auto again = NvmeStore::open(options(), std::vector<RegionSpec>{{"master", 1}});
  EXPECT_TRUE(again.ok()) << again.status().message();
}

TEST_F(NvmeStoreTest, SecondStoreOnTheSameDirectoryIsRefused) {
  auto first = open(options(), {{"a", 4096}});
  ASSERT_TRUE(first);
  auto second = NvmeStore::open(options(), std::vector<RegionSpec>{{"a", 4096}});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(first->dir()), std::string::npos) << second.status().message();
  EXPECT_NE(second.status().message().find("in use by another zoe store"), std::string::npos);
  // The refused store touched nothing of the first one.
  EXPECT_TRUE(fs::exists(first->dir() + "/a.swap"));
  const std::vector<uint8_t> d = random_bytes(4096, 3);
  EXPECT_TRUE(first->write(0, 0, d.data(), d.size()).ok());
  NvmeStoreOptions other = options();
  other.rank = 1;  // another rank of the same job has its own directory
  EXPECT_TRUE(NvmeStore::open(other, std::vector<RegionSpec>{{"a", 4096}}).ok());
}

TEST_F(NvmeStoreTest, FreeSpaceIsCheckedBeforeAnythingIsWritten) {
  FaultInjectingEnv env(NvmeEnv::Default());
  env.set_free_bytes(uint64_t{3} << 20);
  NvmeStoreOptions o = options();
  o.env = &env;
  auto r = NvmeStore::open(o, std::vector<RegionSpec>{{"master", 2 << 20}, {"exp_avg", 2 << 20}});
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("needs 4194304 bytes (4.0 MiB)"), std::string::npos) << m;
  EXPECT_NE(m.find("free 3145728 bytes (3.0 MiB)"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(root_ + "/zoe-test-rank0"));
  // add_regions on an open store checks the same way and adds nothing.
  auto store = open(o, {{"master", 2 << 20}});
  ASSERT_TRUE(store);
  env.set_free_bytes(uint64_t{1} << 20);
  const std::vector<RegionSpec> more = {{"exp_avg", 2 << 20}};
  Status s = store->add_regions(more);
  EXPECT_NE(s.message().find("needs"), std::string::npos) << s.message();
  EXPECT_EQ(store->regions(), 1);
  EXPECT_FALSE(fs::exists(store->dir() + "/exp_avg.swap"));
}

// ---- a queue that fails while the kernel holds requests ------------------------------------

// Waits until `n` requests of kind `op` reached the queue (held ones included).
bool requests_reach(const FaultInjectingEnv& env, IoOp op, int n) {
  for (int i = 0; i < 5000 && env.requests(op) < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return env.requests(op) >= n;
}

// When the queue itself fails (io_uring_enter), requests the kernel took still own their memory:
// their transfers fail, but complete only once their completions are reaped, so neither the
// caller's memory nor a bounce buffer is handed back while the kernel may still write into it.
// Transfers submitted after the failure fail at once.
TEST_F(NvmeStoreTest, AfterAQueueFailureMemoryComesBackOnlyWhenTheKernelIsDone) {
  FaultInjectingEnv env(NvmeEnv::Default());
  NvmeStoreOptions o = options();
  o.env = &env;
  const std::vector<uint8_t> x = random_bytes(2 * kBlock, 21);
  AlignedBuffer direct(kBlock);          // the request reads straight into it
  std::vector<uint8_t> bounced(kBlock);  // through a bounce buffer: an unaligned range
  auto store = open(o, {{"state", 4 * kBlock}});
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->write(0, 0, x.data(), x.size()).ok());
  std::memset(direct.p, 0, kBlock);
  env.hold(IoOp::kRead, true);
  struct Unhold {  // before the store closes, which waits for the reads, even when a check fails
    FaultInjectingEnv& e;
    ~Unhold() { e.hold(IoOp::kRead, false); }
  } unhold{env};
  const int before = env.requests(IoOp::kRead);
  Ticket a = store->read_async(0, 0, direct.p, kBlock);
  Ticket b = store->read_async(0, kBlock + 1, bounced.data(), kBlock - 1);
  ASSERT_TRUE(requests_reach(env, IoOp::kRead, before + 2));
  env.fail_submits(EBADR);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(store->ready(a)) << "handed back while the kernel holds its request";
  EXPECT_FALSE(store->ready(b));
  std::vector<uint8_t> late(kBlock);
  Status s = store->read(0, 0, late.data(), late.size());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find("io_uring_enter failed"), std::string::npos) << s.message();

  env.hold(IoOp::kRead, false);  // the kernel completes them
  for (const Ticket* t : {&a, &b}) {
    s = store->wait(*t);
    EXPECT_EQ(s.code(), Code::kIo);
    EXPECT_NE(s.message().find("io_uring_enter failed: Invalid request descriptor (EBADR"), std::string::npos)
        << s.message();
  }
  // The read landed before its wait returned, and nothing lands later.
  EXPECT_EQ(0, std::memcmp(direct.p, x.data(), kBlock));
  EXPECT_TRUE(store->close().ok());
}

// When reaping fails too, for good, the requests are abandoned after a while: their transfers
// fail saying so, and their bounce buffers never go back to the pool (leaked, not reused).
TEST_F(NvmeStoreTest, RequestsThatCannotBeReapedAreAbandonedAndTheirBuffersNeverReused) {
  PinnedPoolOptions po;
  po.bytes = 8 * kBlock;
  po.pin = false;
  auto pool = PinnedPool::create(po);
  ASSERT_TRUE(pool.ok());
  FaultInjectingEnv env(NvmeEnv::Default());
  NvmeStoreOptions o = options();
  o.env = &env;
  o.pool = pool.value().get();
  o.queue_depth = 2;  // two bounce buffers
  std::vector<uint8_t> bounced(kBlock);
  auto store = open(o, {{"state", 4 * kBlock}});
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->write(0, 0, bounced.data(), kBlock).ok());  // a never-written block is read without a request
  env.hold(IoOp::kRead, true);
  struct Unhold {
    FaultInjectingEnv& e;
    ~Unhold() { e.hold(IoOp::kRead, false); }
  } unhold{env};
  const int before = env.requests(IoOp::kRead);
  Ticket b = store->read_async(0, 1, bounced.data(), kBlock - 1);
  ASSERT_TRUE(requests_reach(env, IoOp::kRead, before + 1));
  env.fail_submits(EBADR, 1 << 30);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(store->ready(b)) << "handed back while the kernel holds its request";
  Status s = store->wait(b);  // about 2 s of reaping
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find("abandoned, the kernel may still use their memory"), std::string::npos) << s.message();
  EXPECT_TRUE(store->close().ok());
  EXPECT_EQ(pool.value()->available(), 7u * kBlock) << "the abandoned bounce buffer went back to the pool";
}

// ---- faults through the injectable environment ----------------------------------------------

class NvmeFaultTest : public NvmeStoreTest {
 protected:
  void SetUp() override {
    NvmeStoreTest::SetUp();
    NvmeStoreOptions o = options();
    o.env = &env_;
    store_ = open(o, {{"state", 16 * kBlock}});
    ASSERT_TRUE(store_);
    before_ = random_bytes(8 * kBlock, 10);  // blocks 0..7, written before any fault
    ASSERT_TRUE(store_->write(0, 0, before_.data(), before_.size()).ok());
    after_ = random_bytes(8 * kBlock, 11);   // for blocks 8..15
  }
  void expect_before_intact() {
    std::vector<uint8_t> back(before_.size());
    Status s = store_->read(0, 0, back.data(), back.size());
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(back == before_);
  }
  std::string path() const { return store_->region_path(0); }
  // One byte of block 3 changed behind the store's back.
  void flip_a_byte_of_block_3() {
    int fd = ::open(path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const uint8_t flipped = before_[3 * kBlock + 77] ^ 0x40;
    ASSERT_EQ(::pwrite(fd, &flipped, 1, 3 * kBlock + 77), 1);
    ASSERT_EQ(::fdatasync(fd), 0);
    ::close(fd);
  }

  FaultInjectingEnv env_{NvmeEnv::Default()};
  std::unique_ptr<NvmeStore> store_;
  std::vector<uint8_t> before_, after_;
};

TEST_F(NvmeFaultTest, EioAtTheKthWriteNamesFileOffsetOpAndErrno) {
  env_.fail_requests(IoOp::kWrite, env_.requests(IoOp::kWrite) + 3, EIO);
  Status s = store_->write(0, 8 * kBlock, after_.data(), after_.size());
  ASSERT_EQ(s.code(), Code::kIo);
  // The third request of this write is block 10.
  EXPECT_EQ(s.message(), path() + ": write of 65536 bytes at offset " + std::to_string(10 * kBlock) +
                             " failed: Input/output error (EIO, errno 5)");
  expect_before_intact();
  // The blocks submitted before the fault landed; the failed one cannot be read until rewritten.
  std::vector<uint8_t> back(2 * kBlock);
  ASSERT_TRUE(store_->read(0, 8 * kBlock, back.data(), back.size()).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), after_.data(), back.size()));
  Status r = store_->read(0, 10 * kBlock + 5, back.data(), 10);
  EXPECT_EQ(r.code(), Code::kCorrupt);
  EXPECT_NE(r.message().find(path() + ": block 10"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("last write failed"), std::string::npos);
  ASSERT_TRUE(store_->write(0, 10 * kBlock, after_.data() + 2 * kBlock, kBlock).ok());
  ASSERT_TRUE(store_->read(0, 10 * kBlock, back.data(), kBlock).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), after_.data() + 2 * kBlock, kBlock));
}

TEST_F(NvmeFaultTest, EnospcFromTheDeviceIsOneClearError) {
  env_.fail_requests(IoOp::kWrite, env_.requests(IoOp::kWrite) + 1, ENOSPC);
  Status s = store_->write(0, 8 * kBlock + 100, after_.data(), 1000);  // a partial block
  ASSERT_EQ(s.code(), Code::kIo);
  // Checksums on: the whole block moves (its sum covers all of it), so the request is the block.
  EXPECT_EQ(s.message(), path() + ": write of 65536 bytes at offset " + std::to_string(8 * kBlock) +
                             " failed: No space left on device (ENOSPC, errno 28)");
}

TEST_F(NvmeFaultTest, EioOnReadNamesTheRead) {
  env_.fail_requests(IoOp::kRead, env_.requests(IoOp::kRead) + 2, EIO);
  std::vector<uint8_t> back(before_.size());
  Status s = store_->read(0, 0, back.data(), back.size());
  EXPECT_EQ(s.message(), path() + ": read of 65536 bytes at offset 65536 failed: Input/output error (EIO, errno 5)");
  expect_before_intact();  // a failed read harms nothing
}

TEST_F(NvmeFaultTest, ShortTransfersAreResubmittedForTheRest) {
  // Three of the eight block requests transfer half their bytes.
  env_.shorten_request(IoOp::kWrite, env_.requests(IoOp::kWrite) + 1);
  env_.shorten_request(IoOp::kWrite, env_.requests(IoOp::kWrite) + 2);
  env_.shorten_request(IoOp::kWrite, env_.requests(IoOp::kWrite) + 4);
  const int writes = env_.requests(IoOp::kWrite);
  ASSERT_TRUE(store_->write(0, 8 * kBlock, after_.data(), after_.size()).ok());
  EXPECT_EQ(env_.requests(IoOp::kWrite) - writes, 8 + 3);  // 8 blocks, 3 resubmissions
  env_.shorten_request(IoOp::kRead, env_.requests(IoOp::kRead) + 1);
  std::vector<uint8_t> back(after_.size());
  ASSERT_TRUE(store_->read(0, 8 * kBlock, back.data(), back.size()).ok());
  EXPECT_TRUE(back == after_);
  expect_before_intact();
}

TEST_F(NvmeFaultTest, EagainIsRetried) {
  env_.fail_requests(IoOp::kWrite, env_.requests(IoOp::kWrite) + 1, EAGAIN, 3);
  ASSERT_TRUE(store_->write(0, 8 * kBlock, after_.data(), kBlock).ok());
  env_.fail_requests(IoOp::kRead, env_.requests(IoOp::kRead) + 1, EAGAIN, 2);
  std::vector<uint8_t> back(kBlock);
  ASSERT_TRUE(store_->read(0, 8 * kBlock, back.data(), back.size()).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), after_.data(), kBlock));
}

TEST_F(NvmeFaultTest, ChecksumMismatchNamesFileAndBlock) {
  flip_a_byte_of_block_3();
  std::vector<uint8_t> back(before_.size());
  Status s = store_->read(0, 0, back.data(), back.size());
  ASSERT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find(path() + ": checksum mismatch in block 3 (bytes 196608..262143)"), std::string::npos)
      << s.message();
  // A read that does not touch block 3 is fine; a small one inside it is not.
  ASSERT_TRUE(store_->read(0, 0, back.data(), 3 * kBlock).ok());
  EXPECT_EQ(store_->read(0, 3 * kBlock + 70, back.data(), 2).code(), Code::kCorrupt);
}

// `landed` runs once a read is in the caller's memory and checked, before any wait returns;
// never for a read that failed (EIO) or whose block does not match its sum.
TEST_F(NvmeFaultTest, LandedRunsForAGoodReadOnlyBeforeItsWaitReturns) {
  std::atomic<int> landed{0};
  TransferOptions o;
  o.landed = [&] { ++landed; };
  std::vector<uint8_t> back(before_.size());
  Ticket t = store_->read_async(0, 0, back.data(), back.size(), o);
  ASSERT_TRUE(store_->wait(t).ok());
  EXPECT_EQ(landed.load(), 1);  // at the wait's return, not later
  EXPECT_TRUE(back == before_);
  env_.fail_requests(IoOp::kRead, env_.requests(IoOp::kRead) + 2, EIO);
  EXPECT_EQ(store_->wait(store_->read_async(0, 0, back.data(), back.size(), o)).code(), Code::kIo);
  EXPECT_EQ(landed.load(), 1);
  flip_a_byte_of_block_3();
  EXPECT_EQ(store_->wait(store_->read_async(0, 0, back.data(), back.size(), o)).code(), Code::kCorrupt);
  EXPECT_EQ(landed.load(), 1);
}

// ---- a real, small file system ----------------------------------------------------------------

class NvmeTmpfsTest : public NvmeStoreTest {
 protected:
  void SetUp() override {
    NvmeStoreTest::SetUp();
    mnt_ = root_ + "/mnt";
    fs::create_directory(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=8M") != 0)
      GTEST_SKIP() << "mount -t tmpfs -o size=8M refused (" << std::strerror(errno)
                   << "): needs root or CAP_SYS_ADMIN; the full-disk tests are skipped";
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
    NvmeStoreTest::TearDown();
  }
  NvmeStoreOptions tmpfs_options() const {
    NvmeStoreOptions o = options();
    o.nvme_path = mnt_ + "/swap";
    return o;
  }
  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(NvmeTmpfsTest, TooLargeIsRefusedUpFront) {
  auto r = NvmeStore::open(tmpfs_options(), std::vector<RegionSpec>{{"master", 16 << 20}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs 16777216 bytes (16.0 MiB) (master 16777216 bytes (16.0 MiB)), free "),
            std::string::npos)
      << r.status().message();
  EXPECT_TRUE(fs::is_empty(mnt_ + "/swap"));  // nothing written, the store's directory gone
}

TEST_F(NvmeTmpfsTest, PreallocatedRegionsSurviveAFullFileSystem) {
  auto store = open(tmpfs_options(), {{"master", 4 << 20}});
  ASSERT_TRUE(store);
  // Someone else fills the file system.
  {
    const std::vector<uint8_t> junk(1 << 20, 1);
    int fd = ::open((mnt_ + "/filler").c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    while (::write(fd, junk.data(), junk.size()) > 0) {
    }
    EXPECT_EQ(errno, ENOSPC);
    ::close(fd);
  }
  const std::vector<uint8_t> d = random_bytes(4 << 20, 5);
  Status s = store->write(0, 0, d.data(), d.size());
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<uint8_t> back(d.size());
  ASSERT_TRUE(store->read(0, 0, back.data(), back.size()).ok());
  EXPECT_TRUE(back == d);
}

TEST_F(NvmeTmpfsTest, WritingPastTheEndOfTheDiskIsEnospcNamingFileOffsetOp) {
  // Lie about free space and skip preallocation, so the writes meet the full disk for real.
  FaultInjectingEnv env(NvmeEnv::Default());
  env.set_free_bytes(uint64_t{1} << 30);
  env.set_sparse_allocate(true);
  NvmeStoreOptions o = tmpfs_options();
  o.env = &env;
  auto store = open(o, {{"master", 16 << 20}});
  ASSERT_TRUE(store);
  const std::vector<uint8_t> d = random_bytes(16 << 20, 6);
  Status s = store->write(0, 0, d.data(), d.size());
  ASSERT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find(store->region_path(0) + ": write of "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(" bytes at offset "), std::string::npos);
  EXPECT_NE(s.message().find("failed: No space left on device (ENOSPC, errno 28)"), std::string::npos);
  // The first block went in before the disk filled up.
  std::vector<uint8_t> back(kBlock);
  ASSERT_TRUE(store->read(0, 0, back.data(), kBlock).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), d.data(), kBlock));

  // And with preallocation but a lying free-space check, fallocate is what refuses.
  env.set_sparse_allocate(false);
  const std::vector<RegionSpec> more = {{"exp_avg", 16 << 20}};
  Status a = store->add_regions(more);
  EXPECT_NE(a.message().find("exp_avg.swap: cannot reserve 16777216 bytes (fallocate): No space left on device"),
            std::string::npos)
      << a.message();
  EXPECT_FALSE(fs::exists(store->dir() + "/exp_avg.swap"));
}

TEST(BlockTableTest, BlockSumsAreTheCheckpointsXxh3) {
  const std::vector<uint8_t> d = random_bytes(100003, 7);
  EXPECT_EQ(Checksum::checksum_to_hex(BlockTable::hash(d.data(), d.size())), checksum_buffer(d.data(), d.size()));
}

// ---- the pinned pool ---------------------------------------------------------------------------

TEST(PinnedPoolTest, ExhaustionBacksPressureNeverAllocates) {
  Ledger ledger;
  PinnedPoolOptions o;
  o.bytes = 1 << 20;
  o.ledger = &ledger;
  auto pool = PinnedPool::create(o);
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  PinnedPool& p = *pool.value();
  EXPECT_TRUE(p.pinned());
  EXPECT_EQ(ledger.snapshot().bytes[1][static_cast<int>(Kind::kStaging)], 1u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.pieces()[0].iov_base) % 4096, 0u);

  auto a = p.acquire(600 << 10);
  ASSERT_TRUE(a.ok());
  auto b = p.try_acquire(600 << 10);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b.value()) << "would block: an empty lease, not an allocation";
  EXPECT_EQ(p.piece_of(a.value().data() + 10, 100), 0);
  EXPECT_EQ(p.piece_of(&o, 1), -1);
  EXPECT_EQ(p.acquire(2 << 20).status().code(), Code::kInvalidInput);  // could never be satisfied

  std::atomic<bool> got{false};
  std::thread t([&] {
    auto c = p.acquire(600 << 10);  // waits for `a`
    got = c.ok() && static_cast<bool>(c.value());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());
  a.value().reset();
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(p.available(), 1u << 20);  // everything came back and coalesced
  pool.value().reset();
  EXPECT_EQ(ledger.snapshot().bytes[1][static_cast<int>(Kind::kStaging)], 0u);
}

// A lease given up (a window a failed device copy may still read) is never handed out again; a
// request the rest can no longer hold is an error at once, and one waiting for it is woken with
// that error, never left waiting: after a device failure the pipeline ends, it does not hang.
TEST(PinnedPoolTest, LeasesGivenUpMakeWhatCanNeverFitAnErrorNotAWait) {
  PinnedPoolOptions o;
  o.bytes = 1 << 20;
  o.pin = false;
  auto pool = PinnedPool::create(o);
  ASSERT_TRUE(pool.ok()) << pool.status().message();
  PinnedPool& p = *pool.value();
  auto a = p.acquire(512 << 10), b = p.acquire(512 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  Result<PinnedPool::Lease> waited = Status::Ok();
  std::thread t([&] { waited = p.acquire(1 << 20); });  // waits for a and b
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  a.value().leak();
  t.join();
  ASSERT_FALSE(waited.ok());
  EXPECT_NE(waited.status().message().find("can no longer be served: 524288 bytes (512.0 KiB) of its 1048576 bytes (1.0 MiB) were given up"),
            std::string::npos)
      << waited.status().message();
  b.value().reset();
  auto c = p.acquire(512 << 10);  // what was not given up still serves
  ASSERT_TRUE(c.ok() && c.value()) << c.status().message();
  EXPECT_NE(c.value().data(), nullptr);
  EXPECT_FALSE(p.acquire(600 << 10).ok()) << "more than the pool less what was given up";
}

// Offsets past 4 GiB (2^32 bytes: an fp32 region of more than 2^30 elements) and past 2^31 reach
// their own bytes: each of four places gets its own pattern, written and read back, with the
// block sums on. The file is preallocated, not written, so it costs no disk time.
TEST_F(NvmeStoreTest, OffsetsPast4GiBReachTheirOwnBytes) {
  const uint64_t big = (uint64_t{5} << 30) + kBlock;
  const uint64_t at[] = {0, (uint64_t{1} << 31) + 3 * kBlock, uint64_t{1} << 32, (uint64_t{1} << 32) + 7 * kBlock + 100};
  auto store = NvmeStore::open(options(), std::vector<RegionSpec>{{"big", big}});
  if (!store.ok() && store.status().code() == Code::kInvalidInput &&
      store.status().message().find("free") != std::string::npos)
    GTEST_SKIP() << "no room for a 5 GiB preallocated file here: " << store.status().message();
  ASSERT_TRUE(store.ok()) << store.status().message();
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 4; i++) {
    data.push_back(random_bytes(2 * kBlock, 40 + i));
    ASSERT_TRUE((*store)->write(0, at[i], data[i].data(), data[i].size()).ok()) << at[i];
  }
  for (int i = 0; i < 4; i++) {
    std::vector<uint8_t> got(data[i].size());
    ASSERT_TRUE((*store)->read(0, at[i], got.data(), got.size()).ok()) << at[i];
    EXPECT_EQ(got, data[i]) << "offset " << at[i];
  }
}

}  // namespace
}  // namespace zoe

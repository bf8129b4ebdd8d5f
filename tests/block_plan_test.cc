// BlockPlan (nvme/block_plan.h): how each block of a transfer moves, decided without a queue:
// direct when range and memory are aligned, a bounce buffer otherwise; a partial write of a
// written block reads its span first (read-modify-write), of a never-written or padded one writes
// zeros around the caller's bytes; with checksums the request spans the whole block.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "nvme/block_plan.h"

namespace zoe::test {
namespace {

constexpr uint64_t kBlock = 16384, kAlign = 4096;

RegionFile region(uint64_t bytes, bool checksums) {
  const uint64_t file_bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  return RegionFile{"r", "/nowhere/r", DirectFile{-1, 4096, 4096}, 0, bytes, file_bytes,
                    BlockTable(file_bytes, kBlock, checksums, {}, kAlign)};
}

struct Aligned {
  uint8_t* p = static_cast<uint8_t*>(std::aligned_alloc(4096, 4 * kBlock));
  ~Aligned() { std::free(p); }
};

Transfer transfer(IoOp op, RegionFile& r, uint64_t offset, uint64_t bytes, uint8_t* user) {
  Transfer t;
  t.op = op;
  t.region = &r;
  t.offset = offset;
  t.bytes = bytes;
  t.user = user;
  return t;
}

TEST(BlockPlan, AlignedRangeInAlignedMemoryMovesDirectlyBlockByBlock) {
  RegionFile r = region(4 * kBlock, false);
  Aligned mem;
  Transfer t = transfer(IoOp::kWrite, r, kBlock, 2 * kBlock, mem.p);
  BlockPlan p = plan_block(t, r, kBlock);
  EXPECT_EQ(p.block, 1u);
  EXPECT_TRUE(p.direct);
  EXPECT_FALSE(p.read_first);
  EXPECT_EQ(p.io_begin, kBlock);
  EXPECT_EQ(p.io_end, 2 * kBlock);
  t.scheduled = kBlock;  // the second block next
  p = plan_block(t, r, kBlock);
  EXPECT_EQ(p.block, 2u);
  EXPECT_EQ(p.user_begin, 2 * kBlock);
  EXPECT_TRUE(p.direct);
}

TEST(BlockPlan, MisalignedMemoryGoesThroughABounceBufferWithoutReadingFirst) {
  RegionFile r = region(4 * kBlock, false);
  Aligned mem;
  r.blocks.set_written(0, 0);
  Transfer t = transfer(IoOp::kWrite, r, 0, kBlock, mem.p + 8);
  BlockPlan p = plan_block(t, r, kBlock);
  EXPECT_FALSE(p.direct);
  EXPECT_FALSE(p.read_first);  // the whole span is the caller's
}

TEST(BlockPlan, APartialWriteOfAWrittenBlockReadsItsSpanFirstAndPatchesTheCallersBytesIn) {
  RegionFile r = region(4 * kBlock, false);
  r.blocks.set_written(0, 0);
  std::vector<uint8_t> user(100, 0xab);
  Transfer t = transfer(IoOp::kWrite, r, 5000, user.size(), user.data());
  BlockPlan p = plan_block(t, r, kBlock);
  EXPECT_FALSE(p.direct);
  EXPECT_TRUE(p.read_first);
  EXPECT_EQ(p.io_begin, 4096u);  // the aligned span around the bytes, not the whole block
  EXPECT_EQ(p.io_end, 8192u);
  std::vector<uint8_t> bounce(p.io_bytes(), 0x11);  // what the read brought
  patch_write(p, bounce.data(), user.data());
  for (uint64_t i = 0; i < bounce.size(); ++i) {
    const bool mine = i + p.io_begin >= 5000 && i + p.io_begin < 5100;
    ASSERT_EQ(bounce[i], mine ? 0xab : 0x11) << i;
  }
}

TEST(BlockPlan, APartialWriteOfANeverWrittenOrPaddedBlockWritesZerosAround) {
  RegionFile r = region(4 * kBlock, false);
  std::vector<uint8_t> user(100, 0xab);
  Transfer t = transfer(IoOp::kWrite, r, 5000, user.size(), user.data());
  BlockPlan p = plan_block(t, r, kBlock);  // block 0 never written: the file holds zeros there
  EXPECT_FALSE(p.read_first);
  std::vector<uint8_t> bounce(p.io_bytes(), 0x11);
  stage_write(p, bounce.data(), user.data());
  for (uint64_t i = 0; i < bounce.size(); ++i) {
    const bool mine = i + p.io_begin >= 5000 && i + p.io_begin < 5100;
    ASSERT_EQ(bounce[i], mine ? 0xab : 0) << i;
  }
  r.blocks.set_written(1, 0);  // a written block, but the write says its rest is padding
  Transfer pad = transfer(IoOp::kWrite, r, kBlock, 100, user.data());
  pad.pad_last_block = true;
  BlockPlan q = plan_block(pad, r, kBlock);
  EXPECT_FALSE(q.read_first);
  pad.pad_last_block = false;
  EXPECT_TRUE(plan_block(pad, r, kBlock).read_first);
}

TEST(BlockPlan, WithChecksumsTheRequestSpansTheWholeBlockAndReadsCopyOutTheCallersBytes) {
  RegionFile r = region(4 * kBlock, true);
  Aligned mem;
  Transfer t = transfer(IoOp::kRead, r, kBlock + 4096, 4096, mem.p);
  BlockPlan p = plan_block(t, r, kBlock);
  EXPECT_EQ(p.io_begin, kBlock);
  EXPECT_EQ(p.io_end, 2 * kBlock);
  EXPECT_FALSE(p.direct);  // aligned, but the block's span is more than the caller's bytes
  EXPECT_FALSE(p.read_first);  // reads never do
  std::vector<uint8_t> bounce(p.io_bytes());
  for (size_t i = 0; i < bounce.size(); ++i) bounce[i] = static_cast<uint8_t>(i / 4096);
  unstage_read(p, bounce.data(), mem.p);
  EXPECT_EQ(mem.p[0], 1);
  EXPECT_EQ(mem.p[4095], 1);
}

}  // namespace
}  // namespace zoe::test

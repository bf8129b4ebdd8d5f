// The I/O thread's order of foreground blocks (nvme/transfer_order.h): reads first, writes in the
// slots they leave, behind no write-back they do not depend on; a transfer never overtakes one
// ahead of it that touches its bytes with a write on either side.
#include <gtest/gtest.h>

#include <memory>

#include "nvme/transfer_order.h"

namespace zoe::test {
namespace {

RegionFile region_a{"a", "/nowhere/a", {}, 0, 64 << 20, 64 << 20, BlockTable(64 << 20, 1 << 20, false)};
RegionFile region_b{"b", "/nowhere/b", {}, 1, 64 << 20, 64 << 20, BlockTable(64 << 20, 1 << 20, false)};

std::shared_ptr<Transfer> transfer(IoOp op, RegionFile& r, uint64_t mib_from, uint64_t mib_to, uint64_t scheduled_mib = 0) {
  auto t = std::make_shared<Transfer>();
  t->op = op;
  t->region = &r;
  t->offset = mib_from << 20;
  t->bytes = (mib_to - mib_from) << 20;
  t->scheduled = scheduled_mib << 20;
  return t;
}

TEST(TransferOrder, AReadGoesAheadOfWriteBacksOfOtherBytes) {
  TransferList q = {transfer(IoOp::kWrite, region_a, 0, 8), transfer(IoOp::kWrite, region_a, 8, 16),
                    transfer(IoOp::kRead, region_a, 16, 24)};
  EXPECT_EQ(earliest_startable(q, IoOp::kRead), 2);
  EXPECT_EQ(earliest_startable(q, IoOp::kWrite), 0);
  q[2]->scheduled = 8 << 20;  // the read handed out: writes fill the queue
  q.pop_back();
  EXPECT_EQ(earliest_startable(q, IoOp::kRead), -1);
  EXPECT_EQ(earliest_startable(q, IoOp::kWrite), 0);
}

TEST(TransferOrder, NothingOvertakesAWriteOfItsBytesNorAWriteAReadOfThem) {
  // The read wants bytes the write ahead of it has not started yet: it waits its turn.
  TransferList q = {transfer(IoOp::kWrite, region_a, 0, 8, /*scheduled*/ 2), transfer(IoOp::kRead, region_a, 6, 10)};
  EXPECT_FALSE(may_start(q, 1));
  EXPECT_EQ(earliest_startable(q, IoOp::kRead), -1);
  EXPECT_EQ(earliest_startable(q, IoOp::kWrite), 0);
  // Bytes the write has already handed out are the I/O thread's to order, block by block.
  q[0]->scheduled = 7 << 20;
  EXPECT_FALSE(may_start(q, 1));
  q[0]->scheduled = 8 << 20;
  EXPECT_TRUE(may_start(q, 1));
  // A write behind a read of its bytes waits too; reads pass reads; other regions pass anything.
  TransferList r = {transfer(IoOp::kRead, region_a, 0, 8), transfer(IoOp::kWrite, region_a, 4, 5),
                    transfer(IoOp::kRead, region_a, 0, 8), transfer(IoOp::kWrite, region_b, 0, 8)};
  EXPECT_FALSE(may_start(r, 1));
  EXPECT_FALSE(may_start(r, 2));  // behind the write of bytes 4..5
  EXPECT_TRUE(may_start(r, 3));
  EXPECT_EQ(earliest_startable(r, IoOp::kRead), 0);
  EXPECT_EQ(earliest_startable(r, IoOp::kWrite), 3);
}

TEST(TransferOrder, OneOpAloneTakesTheWholeQueue) {
  TransferList q = {transfer(IoOp::kRead, region_a, 0, 8), transfer(IoOp::kRead, region_b, 0, 8)};
  EXPECT_EQ(earliest_startable(q, IoOp::kRead), 0);
  EXPECT_EQ(earliest_startable(q, IoOp::kWrite), -1);
  TransferList w = {transfer(IoOp::kWrite, region_a, 0, 8)};
  EXPECT_EQ(earliest_startable(w, IoOp::kRead), -1);
  EXPECT_EQ(earliest_startable(w, IoOp::kWrite), 0);
}

}  // namespace
}  // namespace zoe::test

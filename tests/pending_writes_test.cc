// PendingWrites (nvme/pending_writes.h): a read that pending writes hold whole is served from
// their memory, each byte from the newest write holding it; a byte held by none, or by a failed
// write first, and the read waits for the device; another region's writes never serve it.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "nvme/pending_writes.h"

namespace zoe::test {
namespace {

struct Fixture {
  RegionFile a{"a", "/nowhere/a", {}, 0, 1 << 20, 1 << 20, BlockTable(1 << 20, 1 << 16, false)};
  RegionFile b{"b", "/nowhere/b", {}, 1, 1 << 20, 1 << 20, BlockTable(1 << 20, 1 << 16, false)};
  std::vector<std::vector<uint8_t>> memory;

  std::shared_ptr<Transfer> write(RegionFile& r, uint64_t offset, uint64_t bytes, uint8_t fill) {
    memory.emplace_back(bytes, fill);
    auto t = std::make_shared<Transfer>();
    t->op = IoOp::kWrite;
    t->region = &r;
    t->offset = offset;
    t->bytes = bytes;
    t->user = memory.back().data();
    return t;
  }
};

Transfer read_of(RegionFile& r, uint64_t offset, std::vector<uint8_t>& into) {
  Transfer t;
  t.region = &r;
  t.offset = offset;
  t.bytes = into.size();
  t.user = into.data();
  return t;
}

TEST(PendingWrites, EachByteComesFromTheNewestWriteHoldingIt) {
  Fixture f;
  PendingWrites p;
  p.add(f.write(f.a, 0, 100, 1));
  p.add(f.write(f.a, 40, 20, 2));  // newer, inside the first
  p.add(f.write(f.b, 0, 100, 9));  // another region
  std::vector<uint8_t> got(80, 0);
  Transfer r = read_of(f.a, 10, got);
  ASSERT_TRUE(p.serve(r));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i + 10 >= 40 && i + 10 < 60 ? 2 : 1) << i;
}

TEST(PendingWrites, AByteNoWriteHoldsOrAFailedWriteLeavesTheReadToTheDevice) {
  Fixture f;
  PendingWrites p;
  EXPECT_TRUE(p.empty());
  p.add(f.write(f.a, 0, 50, 1));
  p.add(f.write(f.a, 60, 40, 2));
  std::vector<uint8_t> got(100, 7);
  Transfer gap = read_of(f.a, 0, got);
  EXPECT_FALSE(p.serve(gap));  // bytes 50..59 are held by none
  EXPECT_EQ(got[0], 7);        // untouched
  auto failed = f.write(f.a, 50, 10, 3);
  failed->failed = true;
  p.add(failed);
  EXPECT_FALSE(p.serve(gap));
  std::vector<uint8_t> other(10);
  Transfer in_b = read_of(f.b, 0, other);
  EXPECT_FALSE(p.serve(in_b));
}

TEST(PendingWrites, ACompletedWriteServesNoMoreAndServedReadsAreMarkedUnchecked) {
  Fixture f;
  PendingWrites p;
  auto w = f.write(f.a, 0, 100, 4);
  p.add(w);
  std::vector<uint8_t> got(100);
  Transfer r = read_of(f.a, 0, got);
  r.caller_sums = std::make_shared<BlockSums>();
  r.caller_sums->sums = {5};
  r.caller_sums->check = {1};
  ASSERT_TRUE(p.serve(r));
  EXPECT_EQ(got[99], 4);
  EXPECT_EQ(r.caller_sums->check[0], 0);  // no device copy was read: nothing to check
  p.remove(*w);
  EXPECT_TRUE(p.empty());
  EXPECT_FALSE(p.serve(r));
}

}  // namespace
}  // namespace zoe::test

// BlockSums: the checksums of the blocks a transfer covers whole, when its caller computes or
// checks them itself. Hashing a block is a pass over its bytes; the I/O thread makes it over
// memory that has gone cold (written long before, or just landed from the disk), while a caller
// that produces or consumes the data can hash it while it has it in cache (the optimizer hashes
// each window in pieces as Adam steps it). Blocks the transfer covers only in part stay the I/O
// thread's: their sums need bytes the caller does not have.
#pragma once
#include <cstdint>
#include <vector>

namespace zoe {

struct BlockSums {
  uint64_t first = 0;           // the first block the transfer covers whole
  std::vector<uint64_t> sums;   // one per whole block: the caller's (writes), the recorded ones (reads)
  std::vector<uint8_t> check;   // reads: 1 where the block was written (it has a sum to check)

  uint64_t count() const { return sums.size(); }
};

// The blocks a range of a region file covers whole: [first, first + count) (BlockTable::whole).
struct WholeBlocks {
  uint64_t first = 0, count = 0;
};

}  // namespace zoe

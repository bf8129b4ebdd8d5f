// Adam over one of the optimizer's pinned windows, making the windowed arrays' block checksums
// while it has the data in cache. Left to the I/O thread, every block of the state is hashed once
// more from DRAM: as it lands (to check it) and before it goes back (to record it). With Adam
// over the window in pieces that fit in L2 (hash the piece as read, step it, hash it as written),
// those passes read cached bytes instead.
//
// The arrays hashed here share one segmentation (StateArray::same_segments) and their grids nest:
// every block is the same bytes, so the 2-byte weights' block holds two of the fp32 state's. Each
// block of the coarsest grid the window covers is one task, stepped piece by piece in order so
// that every streaming hash sees its block's bytes in order. Blocks the window covers only in part
// (at its ends) are stepped without hashing: the I/O thread hashes those (see BlockSums).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/adam.h"
#include "nvme/block_sums.h"
#include "sched/state_array.h"
#include "zoe/status.h"

namespace zoe {

// An Adam range and the optimizer index of its first element.
struct IndexedAdamRange {
  int64_t e = 0;
  AdamRange r;
};

struct HashedArray {
  const StateArray* array = nullptr;
  const char* window = nullptr;     // element a of the array in the window; Adam steps it in place
  std::shared_ptr<BlockSums> in;    // the sums recorded for what was read (null: nothing was read)
  std::shared_ptr<BlockSums> out;   // filled with the sums of what Adam wrote, for the write-back
};

// Steps `ranges` (inside window [a, b), in order of e, not overlapping) and, for each block of
// each array that [a, b) covers whole, checks the read sums (arrays with `in`) and makes the
// written ones. Returns the count of non-finite lanes (as adam_step), or Corrupt when a block read
// does not hash to the sum it was written with. `arrays` share one segmentation and nesting grids
// (see above); their BlockSums were sized by StateArray::caller_blocks(a, b - a). [a, b) lies in
// one segment.
Result<size_t> adam_with_block_sums(const AdamHyper& h, std::span<const IndexedAdamRange> ranges, int64_t a,
                                    int64_t b, std::span<const HashedArray> arrays);

// A BlockSums sized for an array's whole blocks in [a, b) (read: with room for the checks).
std::shared_ptr<BlockSums> make_block_sums(const StateArray& array, int64_t a, int64_t b, bool read);

}  // namespace zoe

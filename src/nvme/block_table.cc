#include "nvme/block_table.h"

#include <algorithm>

#include "common/checksum.h"  // xxh3_64: the library's run-time dispatch (AVX2 / AVX-512)
#include "common/round_up.h"

namespace zoe {

BlockTable::BlockTable(uint64_t file_bytes, uint64_t block_bytes, bool checksums,
                       std::span<const uint64_t> segment_ends, uint64_t align)
    : checksums_(checksums),
      file_bytes_(file_bytes),
      block_bytes_(block_bytes),
      align_(align),
      state_((file_bytes + block_bytes - 1) / block_bytes, State::kUnwritten) {
  for (uint64_t e : segment_ends)
    if (e % block_bytes != 0 && e < file_bytes) short_ends_.push_back(e);
  if (checksums_) sums_.assign(state_.size(), 0);
}

uint64_t BlockTable::end(uint64_t block) const {
  const uint64_t b = begin(block), grid_end = std::min(b + block_bytes_, file_bytes_);
  auto it = std::upper_bound(short_ends_.begin(), short_ends_.end(), b);
  return it != short_ends_.end() && *it < grid_end ? *it : grid_end;
}

uint64_t BlockTable::io_end(uint64_t block) const {
  const uint64_t e = end(block), grid_end = std::min(begin(block) + block_bytes_, file_bytes_);
  return std::min<uint64_t>(round_up<uint64_t>(e, align_), grid_end);
}

bool BlockTable::in_blocks(uint64_t offset, uint64_t bytes) const {
  if (bytes == 0) return true;
  // The only bytes outside blocks: from a short end to the next grid boundary.
  auto it = std::upper_bound(short_ends_.begin(), short_ends_.end(), offset / block_bytes_ * block_bytes_);
  for (; it != short_ends_.end() && *it < offset + bytes; ++it) {
    const uint64_t gap_end = (*it / block_bytes_ + 1) * block_bytes_;
    if (offset < gap_end) return false;
  }
  return true;
}

WholeBlocks BlockTable::whole(uint64_t offset, uint64_t bytes) const {
  const uint64_t last = offset + bytes;
  const uint64_t first = (offset + block_bytes_ - 1) / block_bytes_;
  uint64_t b = first;
  while (b < blocks() && begin(b) < last && end(b) <= last) ++b;
  return {first, b - first};
}

void BlockTable::set_written(uint64_t block, uint64_t sum) {
  state_[block] = State::kWritten;
  if (checksums_) sums_[block] = sum;
}

uint64_t BlockTable::hash(const void* data, size_t bytes) { return xxh3_64(data, bytes); }

}  // namespace zoe

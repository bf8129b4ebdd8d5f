#include "nvme/block_table.h"

#include "ckpt/checksum.h"  // xxh3_64: the library's run-time dispatch (AVX2 / AVX-512)

namespace zoe {

BlockTable::BlockTable(uint64_t file_bytes, uint64_t block_bytes, bool checksums)
    : checksums_(checksums), state_((file_bytes + block_bytes - 1) / block_bytes, State::kUnwritten) {
  if (checksums_) sums_.assign(state_.size(), 0);
}

void BlockTable::set_written(uint64_t block, uint64_t sum) {
  state_[block] = State::kWritten;
  if (checksums_) sums_[block] = sum;
}

uint64_t BlockTable::hash(const void* data, size_t bytes) { return xxh3_64(data, bytes); }

}  // namespace zoe

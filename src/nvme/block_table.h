// BlockTable: what a store knows about each block (aio.block_size bytes) of one region file —
// never written, written (with the xxh3-64 of the whole block when checksums are on), or its last
// write failed (its bytes are undefined, so reading it is an error). Kept in memory only: swap
// files are scratch of one process. Used by the store's I/O thread alone, so not locked.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zoe {

class BlockTable {
 public:
  enum class State : uint8_t { kUnwritten, kWritten, kFailed };

  BlockTable(uint64_t file_bytes, uint64_t block_bytes, bool checksums);

  uint64_t blocks() const { return state_.size(); }
  bool checksums() const { return checksums_; }
  State state(uint64_t block) const { return state_[block]; }
  uint64_t sum(uint64_t block) const { return sums_[block]; }

  void set_written(uint64_t block, uint64_t sum);  // sum is ignored without checksums
  void set_failed(uint64_t block) { state_[block] = State::kFailed; }

  // The block checksum: xxh3-64, seed 0 (the checkpoint files' hash).
  static uint64_t hash(const void* data, size_t bytes);

 private:
  bool checksums_;
  std::vector<State> state_;
  std::vector<uint64_t> sums_;  // empty without checksums
};

}  // namespace zoe

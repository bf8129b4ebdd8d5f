// BlockTable: what a store knows about each block (aio.block_size bytes) of one region file —
// never written, written (with the xxh3-64 of the whole block when checksums are on), or its last
// write failed (its bytes are undefined, so reading it is an error). Kept in memory only: swap
// files are scratch of one process. Used by the store's I/O thread alone, so not locked (the
// block extents are fixed at construction and read by any thread).
//
// Blocks lie on a grid of block_bytes, but a region may say where its caller's segments of data
// end (the next one beginning on the grid): the block holding a segment's end stops there. Its
// sum covers its bytes up to that end, and its requests run on to the next multiple of `align`
// (zeros when written); the rest of the grid block belongs to no block and is never moved. A
// caller whose range reaches the segment's end covers the block whole (it may hash it itself).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "nvme/block_sums.h"

namespace zoe {

class BlockTable {
 public:
  enum class State : uint8_t { kUnwritten, kWritten, kFailed };

  // segment_ends: ascending byte offsets; `align`: what requests round a short block up to.
  BlockTable(uint64_t file_bytes, uint64_t block_bytes, bool checksums, std::span<const uint64_t> segment_ends = {},
             uint64_t align = 1);

  uint64_t blocks() const { return state_.size(); }
  bool checksums() const { return checksums_; }
  State state(uint64_t block) const { return state_[block]; }
  uint64_t sum(uint64_t block) const { return sums_[block]; }

  // Block b's bytes: [begin(b), end(b)); its requests: [begin(b), io_end(b)).
  uint64_t begin(uint64_t block) const { return block * block_bytes_; }
  uint64_t end(uint64_t block) const;
  uint64_t io_end(uint64_t block) const;
  // Whether bytes [offset, offset + bytes) lie in blocks (none of them after a segment's end).
  bool in_blocks(uint64_t offset, uint64_t bytes) const;
  // The blocks that [offset, offset + bytes) covers whole.
  WholeBlocks whole(uint64_t offset, uint64_t bytes) const;

  void set_written(uint64_t block, uint64_t sum);  // sum is ignored without checksums
  void set_failed(uint64_t block) { state_[block] = State::kFailed; }

  // The block checksum: xxh3-64, seed 0 (the checkpoint files' hash).
  static uint64_t hash(const void* data, size_t bytes);

 private:
  bool checksums_;
  uint64_t file_bytes_, block_bytes_, align_;
  std::vector<uint64_t> short_ends_;  // ascending: the segment ends that stop a block early
  std::vector<State> state_;
  std::vector<uint64_t> sums_;  // empty without checksums
};

}  // namespace zoe

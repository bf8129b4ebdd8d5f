// BlockPlan: how the next block of a transfer moves, decided from the transfer, the region's
// block table and the file's alignment (the I/O thread's start_block, apart from its queue).
//
// Bytes go straight between the file and the caller's memory when the range and the address are
// aligned (direct); otherwise through a bounce buffer. A write through a bounce buffer that
// covers only part of its request span reads the span first and patches the caller's bytes in
// (read-modify-write), so the logical size of every region is kept to the byte; it skips that
// read where the rest is known: a never-written block (the fresh, preallocated file holds zeros)
// or a last block the write says is padding (pad_last_block), and writes zeros around instead.
// With checksums the request covers the block's whole span (its sum covers all its data);
// without, the aligned span.
#pragma once
#include <cstdint>

#include "nvme/transfer.h"

namespace zoe {

struct BlockPlan {
  uint64_t block = 0;
  uint64_t user_begin = 0, user_end = 0;  // the caller's bytes in this block (region offsets)
  uint64_t io_begin = 0, io_end = 0;      // the request's span in the file
  bool direct = false;                    // the caller's memory is the request's buffer
  bool read_first = false;                // a write that reads its span first (read-modify-write)

  uint64_t user_bytes() const { return user_end - user_begin; }
  uint32_t io_bytes() const { return static_cast<uint32_t>(io_end - io_begin); }
};

// The plan for t's bytes from t.offset + t.scheduled to the end of the block holding them.
BlockPlan plan_block(const Transfer& t, const RegionFile& r, uint64_t block_bytes);

// A write's last block when the write starts it and says the rest is padding (pad_last_block).
bool pads_rest(const Transfer& t, uint64_t io_begin, uint64_t user_begin, uint64_t user_end);

// The bounce buffer's bytes (io_bytes() of them) for a write that reads nothing first: zeros
// around the caller's bytes.
void stage_write(const BlockPlan& p, uint8_t* bounce, const uint8_t* user);
// After a read-modify-write's read landed in the bounce buffer: the caller's bytes patched in.
void patch_write(const BlockPlan& p, uint8_t* bounce, const uint8_t* user);
// After a read into a bounce buffer: the caller's bytes copied out.
void unstage_read(const BlockPlan& p, const uint8_t* bounce, uint8_t* user);

}  // namespace zoe

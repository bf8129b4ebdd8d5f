// Transfer: one read or write of a byte range of a region, as handed to the I/O thread; a
// Ticket holds it until the caller has waited for it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "nvme/block_sums.h"
#include "nvme/io_queue.h"
#include "nvme/region_file.h"
#include "zoe/status.h"

namespace zoe {

struct Transfer {
  IoOp op = IoOp::kRead;
  RegionFile* region = nullptr;
  uint64_t offset = 0;       // in the region
  uint8_t* user = nullptr;   // the caller's memory (only read for writes)
  uint64_t bytes = 0;
  double submitted_us = 0;   // for the trace: the I/O thread's row shows submission to completion
  // Background: starts only while no other transfer has blocks to hand out, so it may be overtaken
  // (the caller keeps other requests off its blocks until it is waited for).
  bool background = false;
  // The blocks it covers whole whose sums the caller makes (writes) or checks itself (reads: the
  // I/O thread records each block's sum there as it lands). Null: the I/O thread does both.
  std::shared_ptr<BlockSums> caller_sums;
  // A write whose last block past its end is padding: zero-filled there, not read back first.
  bool pad_last_block = false;
  std::function<void()> landed;  // TransferOptions::landed

  // The I/O thread's alone:
  uint64_t scheduled = 0;    // bytes handed to block tasks so far
  int in_flight = 0;         // block tasks not finished
  bool queued = false;       // still in the I/O thread's list (not all blocks handed out)
  bool failed = false;

  Status status;             // the first error; read by waiters once done
  bool done = false;         // guarded by the I/O thread's mutex
};

}  // namespace zoe

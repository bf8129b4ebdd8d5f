// The order in which the I/O thread starts foreground transfers' blocks (policy; IoWorker is the
// mechanism). Reads first: the earliest read that may start takes the next slot, and writes fill
// the slots reads leave. What waits on the disk waits for reads (a fetch, the optimizer's next
// window); a write only has to land before its window is read into again, two sub-groups on.
// Both share one queue at full depth: the optimizer's write-backs are no background transfers
// (capped, and started only while no read waits), which left ~6.5 requests in flight on an
// Intel machine's disk; and reads are not shared out evenly with writes, which on a disk whose
// reads are slower than its writes (reads throttled to half) lost 17 % to the old order.
//
// A transfer may start its remaining bytes before those of the transfers ahead of it only where
// none of them overlaps it with a write on either side: the store runs a byte's requests in
// submission order (requests in flight on one block are kept apart by the I/O thread itself).
#pragma once
#include <deque>
#include <memory>

#include "nvme/transfer.h"

namespace zoe {

using TransferList = std::deque<std::shared_ptr<Transfer>>;  // submission order, blocks left to start

bool may_start(const TransferList& queued, size_t i);

// The earliest transfer of kind `op` in `queued` that may start, or -1. The I/O thread asks for
// a read, and for a write only when no read starts: with a read at the head (which may always
// start) that costs nothing, on the path of every block.
int earliest_startable(const TransferList& queued, IoOp op);

}  // namespace zoe

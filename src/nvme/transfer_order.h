// The order in which the I/O thread starts foreground transfers' blocks (policy; IoWorker is the
// mechanism). Reads and writes share the queue: the next block goes to the op with fewer requests
// in flight (reads on a tie), from the op's earliest transfer that may start. A disk given both at
// once moves them at its mixed rate; one op after the other leaves it at each op's rate in turn,
// with the optimizer's next reads queued behind write-backs they do not depend on.
//
// A transfer may start its remaining bytes before those of the transfers ahead of it only where
// none of them overlaps it with a write on either side: the store runs a byte's requests in
// submission order (requests in flight on one block are kept apart by the I/O thread itself).
#pragma once
#include <array>
#include <deque>
#include <memory>

#include "nvme/transfer.h"

namespace zoe {

using TransferList = std::deque<std::shared_ptr<Transfer>>;  // submission order, blocks left to start

bool may_start(const TransferList& queued, size_t i);

// Indices into `queued` to start the next block from, the preferred first; -1 where none. The
// head may always start, so the first is never -1 for a non-empty list.
std::array<int, 2> next_transfers(const TransferList& queued, int reads_in_flight, int writes_in_flight);

}  // namespace zoe

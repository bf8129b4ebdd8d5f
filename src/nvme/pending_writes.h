// PendingWrites: the writes the I/O thread holds that have not completed, in submission order,
// and the reads they can serve. A read whose every byte a pending write holds is copied from
// those writes' memory (each byte from the newest write holding it) without waiting for them or
// the device: a writer may not touch its memory until its write is waited for, so those are the
// bytes the device will hold. The optimizer writes each unit's new weights and the next forward
// fetches them at once; served so, that fetch waits for neither the write nor the reads queued
// ahead of it, and the disk moves the weights once instead of twice.
//
// The I/O thread's alone (no lock).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "nvme/transfer.h"

namespace zoe {

class PendingWrites {
 public:
  // A write submitted (before any later read is offered to serve()).
  void add(std::shared_ptr<Transfer> w) { writes_.push_back(std::move(w)); }
  // A write completed (or failed): from here on its writer owns its memory again.
  void remove(const Transfer& w);
  bool empty() const { return writes_.empty(); }

  // Fills read r from pending writes' memory if they hold every byte of it, newest first, and
  // returns true; false (r untouched) when some byte is held by none, or by a failed write first.
  // A served read's caller sums are marked unchecked: no device copy was read to check.
  bool serve(Transfer& r) const;

 private:
  std::vector<std::shared_ptr<Transfer>> writes_;
};

}  // namespace zoe

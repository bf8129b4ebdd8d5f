// GatherPool: device buffers for gathered units, reused by size instead of allocated per fetch
// (fresh device memory is slow to get: cudaMalloc, or first-touch pages on the CPU device; and
// a model's units come in few sizes). Free buffers stay booked in the ledger as gather memory;
// when the device is full, acquire() gives them back and tries once more.
//
// With `poison` (ZOE_POISON_RELEASED=1), a buffer given back is filled with 0xff bytes (NaN in
// every float dtype): a framework that still reads a released unit's memory (a view autograd
// saved, say) then computes NaN instead of silently reading stale weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zoe/device.h"

namespace zoe {

class GatherPool {
 public:
  explicit GatherPool(Device& d, bool poison = false) : dev_(d), poison_(poison) {}
  GatherPool(const GatherPool&) = delete;
  GatherPool& operator=(const GatherPool&) = delete;
  ~GatherPool() { trim(); }

  Result<Buffer> acquire(size_t bytes);
  // b is empty afterwards.
  void give_back(Buffer& b);
  // Frees every free buffer.
  void trim();
  // Bytes of the free buffers: booked in the ledger, yet reusable for a gather.
  uint64_t idle_bytes() const;

 private:
  Device& dev_;
  bool poison_;
  std::vector<Buffer> free_;
};

}  // namespace zoe

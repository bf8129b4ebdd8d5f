// GatherPool: device buffers for gathered units, reused by size instead of allocated per fetch
// (fresh device memory is slow to get: cudaMalloc, or first-touch pages on the CPU device; and
// a model's units come in few sizes). Free buffers stay booked in the ledger as gather memory;
// when the device is full, acquire() gives them back and tries once more.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zoe/device.h"

namespace zoe {

class GatherPool {
 public:
  explicit GatherPool(Device& d) : dev_(d) {}
  GatherPool(const GatherPool&) = delete;
  GatherPool& operator=(const GatherPool&) = delete;
  ~GatherPool() { trim(); }

  Result<Buffer> acquire(size_t bytes);
  // b is empty afterwards.
  void give_back(Buffer& b);
  // Frees every free buffer.
  void trim();

 private:
  Device& dev_;
  std::vector<Buffer> free_;
};

}  // namespace zoe

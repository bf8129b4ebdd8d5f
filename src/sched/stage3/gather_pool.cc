#include "sched/stage3/gather_pool.h"

#include <cstdint>

namespace zoe {

Result<Buffer> GatherPool::acquire(size_t bytes) {
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i].bytes == bytes) {
      Buffer b = free_[i];
      free_[i] = free_.back();
      free_.pop_back();
      return b;
    }
  auto b = dev_.alloc(bytes, Tier::kDevice, Kind::kGather);
  if (b.ok() || b.status().code() != Code::kOutOfMemory || free_.empty()) return b;
  trim();  // buffers of other sizes make room
  return dev_.alloc(bytes, Tier::kDevice, Kind::kGather);
}

void GatherPool::give_back(Buffer& b) {
  if (b.data && poison_) {
    std::vector<uint8_t> nan(b.bytes, 0xff);
    (void)dev_.upload(b.data, nan.data(), b.bytes);  // a debugging aid: a failed fill changes nothing else
  }
  if (b.data) free_.push_back(b);
  b = Buffer();
}

void GatherPool::trim() {
  for (Buffer& b : free_) dev_.free(b);
  free_.clear();
}

uint64_t GatherPool::idle_bytes() const {
  uint64_t n = 0;
  for (const Buffer& b : free_) n += b.bytes;
  return n;
}

}  // namespace zoe

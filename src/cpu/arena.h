// A first-fit arena over one reserved address range: the CPU device's "device memory".
// Freed blocks are coalesced and reused, so pages touched once stay warm (fresh pages cost
// seconds per GiB on these machines); the reservation itself costs nothing until touched.
#pragma once
#include <cstddef>
#include <map>
#include <mutex>

#include "zoe/status.h"

namespace zoe {

class Arena {
 public:
  static constexpr size_t kAlign = 64;
  explicit Arena(size_t capacity);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Result<void*> allocate(size_t bytes);   // kOutOfMemory names the request and what is free
  void release(void* p);
  size_t capacity() const { return capacity_; }
  char* base() const { return base_; }
  bool contains(const void* p) const {
    auto c = static_cast<const char*>(p);
    return base_ && c >= base_ && c < base_ + capacity_;
  }
  size_t in_use() const;
  // errno of the reservation when it failed (the arena then has no capacity), else 0.
  int map_error() const { return map_error_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t in_use_ = 0;
  int map_error_ = 0;
  std::map<size_t, size_t> free_;   // offset -> size, coalesced
  std::map<size_t, size_t> used_;   // offset -> size
  mutable std::mutex mu_;
};

}  // namespace zoe

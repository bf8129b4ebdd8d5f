#include "cpu/arena.h"

#include <sys/mman.h>

#include <cerrno>

#include <fmt/format.h>

namespace zoe {

Arena::Arena(size_t capacity) : capacity_((capacity + kAlign - 1) / kAlign * kAlign) {
  if (capacity_ == 0) return;
  void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    map_error_ = errno;
    capacity_ = 0;
    return;
  }
  base_ = static_cast<char*>(p);
  // 2 MiB pages where the kernel's transparent huge pages are on request (Debian's default,
  // "madvise"): the model's tensors are megabytes each, and every op walks them cold; 4 KiB pages
  // cost the bf16 step 6 % (bench/history.md, issue 51). Advice only: a kernel without THP, or
  // without 2 MiB pages to give, maps 4 KiB pages as before.
  (void)madvise(base_, capacity_, MADV_HUGEPAGE);
  free_[0] = capacity_;
}

Arena::~Arena() {
  if (base_) munmap(base_, capacity_);
}

Result<void*> Arena::allocate(size_t bytes) {
  size_t need = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    size_t off = it->first, size = it->second;
    free_.erase(it);
    if (size > need) free_[off + need] = size - need;
    used_[off] = need;
    in_use_ += need;
    return static_cast<void*>(base_ + off);
  }
  size_t largest = 0;
  for (auto& [o, s] : free_) largest = std::max(largest, s);
  return Status::OutOfMemory(fmt::format(
      "device memory budget exhausted: asked for {} bytes, {} of {} in use, largest free block {} "
      "(raise zoe.device_memory_budget or shard/offload more)",
      bytes, in_use_, capacity_, largest));
}

void Arena::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  size_t off = static_cast<size_t>(static_cast<char*>(p) - base_);
  auto u = used_.find(off);
  if (u == used_.end()) return;
  size_t size = u->second;
  used_.erase(u);
  in_use_ -= size;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + size == next->first) {  // merge with the block after
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the block before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += size;
      return;
    }
  }
  free_[off] = size;
}

size_t Arena::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

}  // namespace zoe

// A caching allocator over a raw allocator (cudaMalloc/cudaFree for the CUDA device; fakes in
// tests): memory is taken from the raw allocator in segments, handed out in blocks, and freed
// blocks go back to a cache, coalesced with free neighbours, for the next request. The raw free
// runs only when the budget is reached (the cache is released before failing) and in the
// destructor, never on the hot path.
//
// Pools (as PyTorch's allocator): requests up to 1 MiB come from 2 MiB segments cut into
// 512-byte-aligned blocks; requests up to 10 MiB from 20 MiB segments; larger ones from a
// segment of their own size rounded up to 2 MiB. A request takes the smallest free block of its
// pool that fits (best fit, then lowest address) and splits off the rest when it is large enough
// to serve another request (small pool: 512 bytes, else over 1 MiB).
//
// The budget caps what is reserved from the raw allocator (blocks in use plus the cache). When a
// new segment would pass it, a smaller segment of just the request's size is tried (its block is
// reused whole, never split: pieces stranded in such segments fragmented tight budgets), then every
// segment with nothing in use is returned and the reservation retried; only then does the
// request fail, with Status::OutOfMemory naming the request, the bytes in use and cached and the
// config key of the budget. A failing raw malloc (the GPU itself is full) also releases the cache
// and retries once.
//
// The ledger, when given, is booked with the bytes asked for under the allocation's kind, on
// allocate and release: what is cached never shows in it. Thread-safe.
//
// Blocks are reused at once: a caller must not release a block that work still in flight (on a
// stream other than the one the next user runs on) reads or writes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "gpu/raw_memory.h"
#include "zoe/ledger.h"
#include "zoe/status.h"

namespace zoe::gpu {

class CachingAllocator {
 public:
  static constexpr size_t kAlign = 512;                // block sizes and offsets
  static constexpr size_t kSmallLimit = size_t{1} << 20;
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kMediumLimit = size_t{10} << 20;
  static constexpr size_t kMediumSegment = size_t{20} << 20;
  static constexpr size_t kLargeRound = size_t{2} << 20;

  // `what` names the memory in errors ("device memory"), `budget_key` the config key that sets
  // `budget`. `ledger` may be null (nothing booked).
  CachingAllocator(size_t budget, RawMemory raw, Ledger* ledger = nullptr, Tier tier = Tier::kDevice,
                   std::string what = "device memory", std::string budget_key = "zoe.device_memory_budget");
  ~CachingAllocator();  // every segment goes back to the raw allocator, blocks in use included
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 is allowed), kAlign-aligned relative to its segment.
  Result<void*> allocate(size_t bytes, Kind kind);
  // The block goes back to the cache. False (and nothing changes) when p is not a block in use.
  bool release(void* p);
  // Every segment with no block in use goes back to the raw allocator.
  void release_cached();

  struct Stats {
    size_t budget = 0;
    size_t in_use = 0;     // bytes of the blocks handed out (rounded sizes)
    size_t requested = 0;  // bytes asked for by the blocks handed out
    size_t cached = 0;     // reserved - in_use
    size_t reserved = 0;   // bytes of all segments
    size_t blocks_in_use = 0;
    size_t segments = 0;
    uint64_t raw_mallocs = 0, raw_frees = 0;  // calls to the raw allocator so far
  };
  Stats stats() const;

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;  // while in use
    Kind kind = Kind::kStaging;
    bool in_use = false;
    bool small = false;    // the pool of its segment
    bool whole = false;    // the one block of a segment cut to a request's size: never split
    Block* prev = nullptr; // neighbours within the segment, by address
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : std::less<char*>()(a->ptr, b->ptr);
    }
  };
  using FreeSet = std::set<Block*, BySize>;
  struct Segment {
    size_t bytes = 0;
    Block* head = nullptr;  // the block at the segment's base (it stays the head for the segment's life)
  };

  FreeSet& pool(bool small) { return small ? free_small_ : free_large_; }
  Block* find_free(size_t need, bool small);
  Block* take(Block* b, size_t need);           // marks in use, splitting off the rest
  Result<Block*> new_segment(size_t bytes, size_t need, bool small);
  void release_cached_locked();
  size_t largest_free_locked() const;
  std::string oom_message(size_t bytes, const std::string& raw_error) const;

  const size_t budget_;
  RawMemory raw_;
  Ledger* ledger_;
  const Tier tier_;
  const std::string what_, budget_key_;

  mutable std::mutex mu_;
  FreeSet free_small_, free_large_;
  std::unordered_map<void*, Block*> live_;  // blocks in use, by address
  std::map<char*, Segment> segments_;       // by base address
  size_t reserved_ = 0, in_use_ = 0, requested_ = 0;
  uint64_t raw_mallocs_ = 0, raw_frees_ = 0;
};

}  // namespace zoe::gpu

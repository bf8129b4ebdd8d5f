#include "gpu/caching_allocator.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "common/round_up.h"

#ifdef ZOE_CUDA_EMU  // tools/cuda_emu: kernel arguments stand for their block in its race checks
extern "C" void cuda_emu_note_block(const void* p, size_t bytes, int in_use);
#define ZOE_NOTE_BLOCK(p, bytes, in_use) cuda_emu_note_block(p, bytes, in_use)
#else
#define ZOE_NOTE_BLOCK(p, bytes, in_use) ((void)0)
#endif

namespace zoe::gpu {

CachingAllocator::CachingAllocator(size_t budget, RawMemory raw, Ledger* ledger, Tier tier, std::string what,
                                   std::string budget_key)
    : budget_(budget), raw_(std::move(raw)), ledger_(ledger), tier_(tier), what_(std::move(what)),
      budget_key_(std::move(budget_key)) {}

CachingAllocator::~CachingAllocator() {
  for (auto& [base, seg] : segments_) {
    for (Block* b = seg.head; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    raw_.free(base);
  }
}

Result<void*> CachingAllocator::allocate(size_t bytes, Kind kind) {
  if (bytes > std::numeric_limits<size_t>::max() - kLargeRound)
    return Status::OutOfMemory(fmt::format("{} allocation of {} bytes is impossibly large", what_, bytes));
  const size_t need = round_up(std::max<size_t>(bytes, 1), kAlign);
  const bool small = need <= kSmallLimit;
  std::lock_guard<std::mutex> lock(mu_);
  Block* b = find_free(need, small);
  if (!b) {
    Result<Block*> r = new_segment(bytes, need, small);
    if (!r.ok()) return r.status();
    b = r.value();
  }
  b = take(b, need);
  b->requested = bytes;
  b->kind = kind;
  live_.emplace(b->ptr, b);
  in_use_ += b->size;
  requested_ += bytes;
  if (ledger_) ledger_->add(tier_, kind, bytes);
  ZOE_NOTE_BLOCK(b->ptr, bytes, 1);
  return static_cast<void*>(b->ptr);
}

bool CachingAllocator::release(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return false;
  Block* b = it->second;
  ZOE_NOTE_BLOCK(b->ptr, 0, 0);
  live_.erase(it);
  in_use_ -= b->size;
  requested_ -= b->requested;
  if (ledger_) ledger_->sub(tier_, b->kind, b->requested);
  b->in_use = false;
  b->requested = 0;
  FreeSet& free = pool(b->small);
  if (Block* prev = b->prev; prev && !prev->in_use) {  // merge into the free block before
    free.erase(prev);
    prev->size += b->size;
    prev->next = b->next;
    if (b->next) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (Block* next = b->next; next && !next->in_use) {  // absorb the free block after
    free.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    delete next;
  }
  free.insert(b);
  return true;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.budget = budget_;
  s.in_use = in_use_;
  s.requested = requested_;
  s.reserved = reserved_;
  s.cached = reserved_ - in_use_;
  s.blocks_in_use = live_.size();
  s.segments = segments_.size();
  s.raw_mallocs = raw_mallocs_;
  s.raw_frees = raw_frees_;
  return s;
}

CachingAllocator::Block* CachingAllocator::find_free(size_t need, bool small) {
  FreeSet& free = pool(small);
  Block key;
  key.size = need;  // ptr nullptr: before every block of that size
  auto it = free.lower_bound(&key);
  return it == free.end() ? nullptr : *it;
}

CachingAllocator::Block* CachingAllocator::take(Block* b, size_t need) {
  pool(b->small).erase(b);
  const size_t rest = b->size - need;
  if (!b->whole && (b->small ? rest >= kAlign : rest > kSmallLimit)) {
    Block* r = new Block;
    r->ptr = b->ptr + need;
    r->size = rest;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = need;
    pool(r->small).insert(r);
  }
  b->in_use = true;
  return b;
}

Result<CachingAllocator::Block*> CachingAllocator::new_segment(size_t bytes, size_t need, bool small) {
  const size_t preferred = small ? kSmallSegment : need <= kMediumLimit ? kMediumSegment : round_up(need, kLargeRound);
  const size_t sizes[2] = {preferred, need};
  const int num_sizes = need < preferred ? 2 : 1;
  Status raw_error;  // the last failure of the raw allocator, if any
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1) {  // the cache goes back before the request fails
      const size_t before = segments_.size();
      release_cached_locked();
      if (segments_.size() == before) break;  // nothing was released: nothing changes
    }
    for (int i = 0; i < num_sizes; ++i) {
      const size_t size = sizes[i];
      if (size > budget_ || reserved_ > budget_ - size) continue;
      ++raw_mallocs_;
      Result<void*> r = raw_.malloc(size);
      if (!r.ok()) {
        raw_error = r.status();
        continue;
      }
      char* base = static_cast<char*>(r.value());
      Block* b = new Block;
      b->ptr = base;
      b->size = size;
      b->small = small;
      b->whole = size < preferred;
      segments_[base] = Segment{size, b};
      reserved_ += size;
      pool(small).insert(b);
      return b;
    }
  }
  return Status::OutOfMemory(oom_message(bytes, raw_error.ok() ? std::string() : raw_error.message()));
}

void CachingAllocator::release_cached_locked() {
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* head = it->second.head;
    if (head->in_use || head->next) {  // something in the segment is in use
      ++it;
      continue;
    }
    pool(head->small).erase(head);
    delete head;
    raw_.free(it->first);
    ++raw_frees_;
    reserved_ -= it->second.bytes;
    it = segments_.erase(it);
  }
}

size_t CachingAllocator::largest_free_locked() const {
  size_t largest = 0;
  if (!free_small_.empty()) largest = (*free_small_.rbegin())->size;
  if (!free_large_.empty()) largest = std::max(largest, (*free_large_.rbegin())->size);
  return largest;
}

std::string CachingAllocator::oom_message(size_t bytes, const std::string& raw_error) const {
  const std::string state = fmt::format(
      "{} bytes in use in {} blocks, {} bytes cached in partly used segments (largest free block {})", in_use_,
      live_.size(), reserved_ - in_use_, largest_free_locked());
  if (!raw_error.empty())
    return fmt::format("{} allocation of {} bytes failed: {}; {}; budget {} bytes ({})", what_, bytes, raw_error,
                       state, budget_, budget_key_);
  return fmt::format("{} budget exhausted: asked for {} bytes; {}; budget {} bytes (raise {} or shard/offload more)",
                     what_, bytes, state, budget_, budget_key_);
}

}  // namespace zoe::gpu

#include "nvme/pinned_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/round_up.h"
#include "nvme/io_error.h"

namespace zoe {

namespace {
constexpr uint64_t kHugePage = uint64_t{2} << 20;
}  // namespace

PinnedPool::Lease& PinnedPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_;
    data_ = o.data_;
    size_ = o.size_;
    taken_ = o.taken_;
    o.pool_ = nullptr;
    o.data_ = nullptr;
    o.size_ = 0;
    o.taken_ = 0;
  }
  return *this;
}

void PinnedPool::Lease::reset() {
  if (pool_ && data_) pool_->give_back(data_, taken_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  taken_ = 0;
}

void PinnedPool::Lease::leak() {
  if (pool_) {
    {
      std::lock_guard l(pool_->mu_);
      pool_->leaked_bytes_ += taken_;
    }
    pool_->returned_.notify_all();  // a waiter that can no longer be served says so
  }
  pool_ = nullptr;
  reset();
}

Result<std::unique_ptr<PinnedPool>> PinnedPool::create(const PinnedPoolOptions& o) {
  if (o.bytes == 0) return Status::Invalid("pinned pool: the byte budget must be positive");
  std::unique_ptr<PinnedPool> p(new PinnedPool());
  p->bytes_ = round_up<uint64_t>(o.bytes, kAlign);
  // A pool of a huge page or more is whole huge pages (the few added bytes usable and booked):
  // io_uring keeps a registered buffer as 2 MiB pieces only if every page of it is one, else as
  // 4 KiB pages, and then a 1 MiB request is 256 segments where virtio takes 254: the block layer
  // cut each in two (1 MiB reads at 0.93 of fio's, issue 49).
  if (p->bytes_ >= kHugePage) p->bytes_ = round_up<uint64_t>(p->bytes_, kHugePage);
  // Huge-page aligned, so the kernel can back it with 2 MiB pages (fewer pages to pin and to
  // register); the advice may be refused, which changes nothing but speed.
  p->mapped_ = round_up<uint64_t>(p->bytes_, kHugePage) + kHugePage;
  void* m = ::mmap(nullptr, p->mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return Status::OutOfMemory("pinned pool: cannot map " + bytes_text(p->bytes_) + ": " + errno_text(errno));
  uint8_t* raw = static_cast<uint8_t*>(m);
  uint8_t* aligned = reinterpret_cast<uint8_t*>(round_up<uintptr_t>(reinterpret_cast<uintptr_t>(raw), kHugePage));
  // Trim to exactly the aligned range, so munmap(base_, bytes_) later frees everything.
  if (aligned > raw) ::munmap(raw, aligned - raw);
  const uint64_t tail = (raw + p->mapped_) - (aligned + p->bytes_);
  if (tail) ::munmap(aligned + p->bytes_, tail);
  p->base_ = aligned;
  p->mapped_ = p->bytes_;
  (void)::madvise(p->base_, p->bytes_, MADV_HUGEPAGE);
  if (o.pin) {
    if (::mlock(p->base_, p->bytes_) != 0) {
      const int e = errno;
      struct rlimit rl{};
      ::getrlimit(RLIMIT_MEMLOCK, &rl);
      const std::string limit = rl.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : bytes_text(rl.rlim_cur);
      return Status::OutOfMemory("pinned pool: mlock of " + bytes_text(p->bytes_) + " failed: " + errno_text(e) +
                                 "; RLIMIT_MEMLOCK is " + limit +
                                 ": raise it (ulimit -l, or CAP_IPC_LOCK) or set pin_memory to false");
    }
    p->pinned_ = true;
  }
  // Touch every page now (mlock already has): first touch costs seconds per GiB here, and must
  // not land inside the first transfer.
  if (!p->pinned_ && ::madvise(p->base_, p->bytes_, MADV_POPULATE_WRITE) != 0)
    std::memset(p->base_, 0, p->bytes_);
  p->free_[0] = p->bytes_;
  p->free_bytes_ = p->bytes_;
  p->ledger_ = o.ledger;
  if (p->ledger_) p->ledger_->add(Tier::kHost, Kind::kStaging, p->bytes_);
  return p;
}

PinnedPool::~PinnedPool() {
  if (ledger_) ledger_->sub(Tier::kHost, Kind::kStaging, bytes_);
  if (base_) ::munmap(base_, mapped_);  // also unlocks
}

uint64_t PinnedPool::available() const {
  std::lock_guard l(mu_);
  return free_bytes_;
}

bool PinnedPool::take_locked(uint64_t bytes, uint64_t* offset) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit: few extents in practice
    if (it->second < bytes) continue;
    *offset = it->first;
    const uint64_t rest = it->second - bytes;
    const uint64_t rest_at = it->first + bytes;
    free_.erase(it);
    if (rest) free_[rest_at] = rest;
    free_bytes_ -= bytes;
    return true;
  }
  return false;
}

void PinnedPool::set_reclaimer(Reclaimer r) {
  std::lock_guard l(mu_);
  reclaimer_ = std::move(r);
}

void PinnedPool::reclaim_ready() {
  Reclaimer r;
  {
    std::lock_guard l(mu_);
    r = reclaimer_;
  }
  if (r) (void)r(/*block=*/false);
}

Result<PinnedPool::Lease> PinnedPool::acquire(size_t bytes) { return take(bytes, /*wait=*/true); }

Result<PinnedPool::Lease> PinnedPool::try_acquire(size_t bytes) { return take(bytes, /*wait=*/false); }

Result<PinnedPool::Lease> PinnedPool::take(size_t bytes, bool wait) {
  if (bytes == 0 || bytes > bytes_)
    return Status::Invalid("pinned pool: a lease of " + bytes_text(bytes) + " cannot come from a pool of " +
                           bytes_text(bytes_));
  const uint64_t want = round_up<uint64_t>(bytes, kAlign);
  uint64_t off = 0;
  Lease lease;
  std::unique_lock l(mu_);
  // Not free: what the reclaimer hands back may make it so (it runs without the lock).
  while (!take_locked(want, &off)) {
    if (want > bytes_ - leaked_bytes_)
      return Status::Runtime("pinned pool: a lease of " + bytes_text(bytes) + " can no longer be served: " +
                             bytes_text(leaked_bytes_) + " of its " + bytes_text(bytes_) +
                             " were given up after a failed I/O request or device copy still held them");
    if (reclaimer_) {
      Reclaimer r = reclaimer_;
      l.unlock();
      const bool gave = r(wait);
      l.lock();
      if (gave) continue;
    }
    if (!wait) return lease;  // empty: would block
    // Leases come back from their holders, or become reclaimable (checked again a moment later).
    returned_.wait_for(l, std::chrono::milliseconds(reclaimer_ ? 1 : 1000));
  }
  lease.pool_ = this;
  lease.data_ = base_ + off;
  lease.size_ = bytes;
  lease.taken_ = want;
  return lease;
}

void PinnedPool::give_back(uint8_t* data, uint64_t bytes) {
  {
    std::lock_guard l(mu_);
    free_bytes_ += bytes;
    uint64_t off = static_cast<uint64_t>(data - base_);
    auto next = free_.lower_bound(off);
    if (next != free_.end() && off + bytes == next->first) {  // merge with the extent after
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {  // merge with the extent before
        prev->second += bytes;
        bytes = 0;
      }
    }
    if (bytes) free_[off] = bytes;
  }
  returned_.notify_all();
}

std::vector<iovec> PinnedPool::pieces() const {
  std::vector<iovec> v;
  for (uint64_t off = 0; off < bytes_; off += kPieceBytes)
    v.push_back({base_ + off, static_cast<size_t>(std::min(kPieceBytes, bytes_ - off))});
  return v;
}

int PinnedPool::piece_of(const void* p, size_t n) const {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (b < base_ || b + n > base_ + bytes_ || n == 0) return -1;
  const uint64_t first = static_cast<uint64_t>(b - base_) / kPieceBytes;
  const uint64_t last = static_cast<uint64_t>(b + n - 1 - base_) / kPieceBytes;
  return first == last ? static_cast<int>(first) : -1;
}

}  // namespace zoe

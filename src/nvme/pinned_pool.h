// PinnedPool: the host memory the NVMe tier moves bytes through, allocated once up to a byte
// budget, page-aligned plain memory (so cudaHostRegister can adopt it later), mlocked when
// pin_memory is on and then registered with io_uring by each store that uses it. Leases are
// contiguous ranges; an exhausted pool makes acquire() wait for a lease to come back
// (back-pressure) and try_acquire() say "not now" — never a fresh allocation, never an OOM.
#pragma once
#include <sys/uio.h>

#include <condition_variable>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "zoe/ledger.h"
#include "zoe/status.h"

namespace zoe {

struct PinnedPoolOptions {
  uint64_t bytes = 0;         // the budget; rounded up to whole pages
  bool pin = true;            // mlock every page (pin_memory); a failure is an error, not a warning
  Ledger* ledger = nullptr;   // when given, the pool is booked there as host staging memory
};

class PinnedPool {
 public:
  // Lease alignment and granularity: a page, which also satisfies O_DIRECT.
  static constexpr uint64_t kAlign = 4096;
  // io_uring registers at most 1 GiB per buffer: the pool is registered in pieces of this size.
  static constexpr uint64_t kPieceBytes = uint64_t{1} << 30;

  // A contiguous range of the pool, given back when the lease is destroyed or reset. Move-only;
  // must not outlive its pool.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { reset(); }

    uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    explicit operator bool() const { return data_ != nullptr; }
    void reset();
    // Gives up the range without giving it back: the pool never hands it out again. For memory
    // the kernel or the device may still write into or read (an I/O request abandoned after its
    // queue failed, a window a failed device copy read). The pool counts it: a lease that the
    // rest can no longer hold is an error, not a wait that never ends.
    void leak();

   private:
    friend class PinnedPool;
    PinnedPool* pool_ = nullptr;
    uint8_t* data_ = nullptr;
    size_t size_ = 0;     // what was asked for
    uint64_t taken_ = 0;  // rounded up to kAlign
  };

  // Maps, touches (so that no first-touch cost lands in a later timing) and, with pin, mlocks the
  // whole budget. Errors name the budget and, for mlock, RLIMIT_MEMLOCK.
  static Result<std::unique_ptr<PinnedPool>> create(const PinnedPoolOptions& o);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Waits until `bytes` contiguous bytes are free. Invalid when bytes is 0 or more than the pool;
  // a Runtime error when more than the pool less its leaked leases.
  Result<Lease> acquire(size_t bytes);
  // Never waits: an empty lease when the bytes are not free now (the caller retries later).
  Result<Lease> try_acquire(size_t bytes);

  // Leases whose holder only waits for queued device work to be done with them (a copy reading a
  // window) may be handed back on demand: when the bytes asked for are not free, take asks the
  // reclaimer first (with `block` for acquire: it may wait for the oldest such work), and tries
  // again if it gave any back. It is called without the pool's lock and must not acquire.
  using Reclaimer = std::function<bool(bool block)>;
  void set_reclaimer(Reclaimer r);
  // Hands back what the reclaimer can now without waiting (before reading available()).
  void reclaim_ready();

  uint64_t capacity() const { return bytes_; }
  uint8_t* base() const { return base_; }
  uint64_t available() const;
  bool pinned() const { return pinned_; }

  // The pool as pieces of at most kPieceBytes, for io_uring_register_buffers; and the index of
  // the piece holding all of [p, p + n), or -1 when that range is not (wholly) in one piece.
  std::vector<iovec> pieces() const;
  int piece_of(const void* p, size_t n) const;

 private:
  PinnedPool() = default;
  Result<Lease> take(size_t bytes, bool wait);
  bool take_locked(uint64_t bytes, uint64_t* offset);
  void give_back(uint8_t* data, uint64_t bytes);

  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t mapped_ = 0;
  bool pinned_ = false;
  Ledger* ledger_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable returned_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  uint64_t free_bytes_ = 0;
  uint64_t leaked_bytes_ = 0;  // given up by Lease::leak: never free again
  Reclaimer reclaimer_;
};

}  // namespace zoe

// WindowRetirement: pinned windows that queued copies still read, held until those copies have
// run and then handed back to their pool, so that a fetch need not wait on the host for its
// upload (ChunkLoad::finish_for_compute). The pool asks for them when it runs short
// (PinnedPool::set_reclaimer); the destructor waits for every copy and hands back the rest.
#pragma once
#include <deque>
#include <mutex>
#include <vector>

#include "nvme/pinned_pool.h"
#include "zoe/device.h"

namespace zoe {

class WindowRetirement {
 public:
  explicit WindowRetirement(Device& dev) : dev_(dev) {}
  ~WindowRetirement() { drain(); }
  WindowRetirement(const WindowRetirement&) = delete;
  WindowRetirement& operator=(const WindowRetirement&) = delete;

  // The windows go back once the work up to `read_by` (the copies that read them) has run.
  void retire(Event read_by, std::vector<PinnedPool::Lease> windows);
  // Hands back the windows whose copies have run; with `block`, waits for the oldest first when
  // none has. Returns whether any went back.
  bool reclaim(bool block);
  // Waits for every copy and hands back every window (before the pool or its registration goes).
  void drain();
  size_t held() const;  // retirements not yet handed back (tests)

 private:
  struct Retired {
    Event read_by;
    std::vector<PinnedPool::Lease> windows;
  };
  Device& dev_;
  mutable std::mutex mu_;
  std::deque<Retired> queue_;  // oldest first
};

}  // namespace zoe

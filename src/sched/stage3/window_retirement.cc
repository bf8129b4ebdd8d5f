#include "sched/stage3/window_retirement.h"

#include <cstdio>
#include <utility>

namespace zoe {

void WindowRetirement::retire(Event read_by, std::vector<PinnedPool::Lease> windows) {
  if (windows.empty()) return;
  std::lock_guard l(mu_);
  queue_.push_back({read_by, std::move(windows)});
}

bool WindowRetirement::reclaim(bool block) {
  std::vector<Retired> back;  // handed back outside the lock (a lease's reset takes the pool's)
  Retired oldest;
  bool waits = false;
  {
    std::lock_guard l(mu_);
    // Each retirement is asked: the queue may hold copies of several loads and streams.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (dev_.done(it->read_by)) {
        back.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (back.empty() && block && !queue_.empty()) {
      oldest = std::move(queue_.front());
      queue_.pop_front();
      waits = true;
    }
  }
  if (waits) {
    Status st = dev_.wait(oldest.read_by);  // without the lock: retire() goes on meanwhile
    if (!st.ok()) {
      // The copy may still read the windows: they must never be reused.
      std::fprintf(stderr, "zoe: waiting for a copy from pinned windows: %s\n", st.message().c_str());
      for (PinnedPool::Lease& w : oldest.windows) w.leak();
      return false;
    }
    back.push_back(std::move(oldest));
  }
  return !back.empty();
}

void WindowRetirement::drain() {
  while (true) {
    {
      std::lock_guard l(mu_);
      if (queue_.empty()) return;
    }
    (void)reclaim(/*block=*/true);
  }
}

size_t WindowRetirement::held() const {
  std::lock_guard l(mu_);
  return queue_.size();
}

}  // namespace zoe

#include "sched/optimizer/unit_gates.h"

namespace zoe {

void UnitGates::reset(int units) {
  std::lock_guard<std::mutex> l(mu_);
  open_.assign(static_cast<size_t>(units), 0);
  cancelled_ = false;
}

void UnitGates::open(int u) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (u < 0 || static_cast<size_t>(u) >= open_.size() || open_[u]) return;
    open_[u] = 1;
  }
  cv_.notify_all();
}

void UnitGates::open_all() {
  {
    std::lock_guard<std::mutex> l(mu_);
    for (char& g : open_) g = 1;
  }
  cv_.notify_all();
}

void UnitGates::cancel() {
  {
    std::lock_guard<std::mutex> l(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

bool UnitGates::is_open(int u) const {
  std::lock_guard<std::mutex> l(mu_);
  return u >= 0 && static_cast<size_t>(u) < open_.size() && open_[u];
}

Status UnitGates::wait(int u) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return cancelled_ || (static_cast<size_t>(u) < open_.size() && open_[u]); });
  if (cancelled_) return Status::Runtime("the update begun in the backward was cancelled: its step is not applied");
  return Status::Ok();
}

}  // namespace zoe

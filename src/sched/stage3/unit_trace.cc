#include "sched/stage3/unit_trace.h"

namespace zoe {

void UnitTrace::begin_step() {
  if (following_ && next_ != plan_.size()) ++deviations_;  // it stopped early
  // A step that stopped early or took another order re-records; one that followed is the same.
  if (!recording_.empty()) plan_.swap(recording_);
  recording_.clear();
  next_ = 0;
  following_ = !plan_.empty();
}

bool UnitTrace::observe(int u) {
  recording_.push_back(u);
  if (following_ && next_ < plan_.size() && plan_[next_] == u) {
    ++next_;
    return true;
  }
  if (following_) ++deviations_;
  following_ = false;
  return false;
}

}  // namespace zoe

// UnitTrace: the order in which one optimizer step fetches units. The first step records it;
// later steps follow it, and the prefetcher plans along it. A step that fetches something else
// stops being followed at that fetch (nothing more is planned for it) and becomes the new plan
// when it ends: a changed model order costs one step of prefetching, never a wrong result.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zoe {

class UnitTrace {
 public:
  // A step begins: the order the last step took becomes the plan.
  void begin_step();
  // Unit u is fetched (outermost fetches only). False when the plan said something else: the
  // step deviates from here on.
  bool observe(int u);

  // The last complete step's order; empty until one step ended.
  const std::vector<int>& plan() const { return plan_; }
  // Index in plan() of the next fetch, while following() holds.
  size_t next() const { return next_; }
  // The step so far is the plan's prefix.
  bool following() const { return following_; }
  // Steps that left their plan (another unit, or fewer fetches).
  int64_t deviations() const { return deviations_; }

 private:
  std::vector<int> plan_, recording_;
  size_t next_ = 0;
  bool following_ = false;
  int64_t deviations_ = 0;
};

}  // namespace zoe

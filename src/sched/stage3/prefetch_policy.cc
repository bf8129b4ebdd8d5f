#include "sched/stage3/prefetch_policy.h"

#include <algorithm>

namespace zoe {

int64_t PrefetchPolicy::live_elems(const std::vector<Residency>& state) const {
  int64_t live = 0;
  for (size_t u = 0; u < state.size(); ++u)
    if (state[u] != Residency::kAbsent) live += elems_[u];
  return live;
}

std::vector<AheadLoad> PrefetchPolicy::ahead(const std::vector<int>& plan, size_t next,
                                             const std::vector<Residency>& state, int64_t room) const {
  std::vector<AheadLoad> start;
  if (limits_.bucket_elems <= 0) return start;
  int64_t live = live_elems(state), in_flight = 0;
  std::vector<char> seen(state.size(), 0);
  for (size_t i = next; i < plan.size(); ++i) {
    int u = plan[i];
    if (seen[u]) continue;
    seen[u] = 1;
    if (state[u] == Residency::kGathered) continue;
    if (in_flight >= limits_.bucket_elems) break;
    in_flight += elems_[u];
    if (state[u] == Residency::kLoading || state[u] == Residency::kStaged) continue;  // counted, on its way
    if (live + elems_[u] > limits_.max_live_elems) break;
    live += elems_[u];
    bool staged = elems_[u] > room;
    if (!staged) room -= elems_[u];
    start.push_back({u, staged});
  }
  return start;
}

bool PrefetchPolicy::keep(const std::vector<int>& plan, size_t next, int u, const std::vector<Residency>& state,
                          int64_t room) const {
  if (room < 0 || limits_.max_reuse_distance <= 0 || live_elems(state) > limits_.max_live_elems) return false;
  int64_t distance = 0;
  for (size_t i = next; i < plan.size(); ++i) {
    if (plan[i] == u) return true;
    distance += elems_[plan[i]];
    if (distance > limits_.max_reuse_distance) return false;
  }
  return false;  // not fetched again this step: the step's update changes it anyway
}

std::vector<int> PrefetchPolicy::evict_order(const std::vector<int>& plan, size_t next, std::vector<int> idle) const {
  const size_t never = plan.size();
  std::vector<size_t> next_use(elems_.size(), never);
  for (size_t i = plan.size(); i-- > next;) next_use[plan[i]] = i;
  std::stable_sort(idle.begin(), idle.end(), [&](int a, int b) {
    return next_use[a] != next_use[b] ? next_use[a] > next_use[b] : a < b;
  });
  return idle;
}

int PrefetchPolicy::gather_ahead(const std::vector<int>& plan, size_t next, int u) const {
  return next < plan.size() && plan[next] != u ? plan[next] : -1;
}

}  // namespace zoe

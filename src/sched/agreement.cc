#include "sched/agreement.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace zoe {

Status Agreement::agree(Call call, int u, const float* grad, bool* need, AheadGather* ahead) {
  if (comm_.size() == 1) return call == Call::kGrads ? reduce_(u, grad) : Status::Ok();
  const int n = comm_.size();
  constexpr int kWords = 5;  // call, unit, need, ahead unit, ahead flags (1 ready, 2 needs)
  int32_t mine[kWords] = {static_cast<int32_t>(call), u, need && *need ? 1 : 0, ahead ? ahead->v : -1,
                          ahead ? (ahead->ready ? 1 : 0) | (ahead->needs ? 2 : 0) : 0};
  std::vector<int32_t> all(kWords * n);
  for (;;) {
    ZOE_RETURN_IF_ERROR(comm_.all_gather_control(mine, all.data(), sizeof(mine)));
    bool same = true, any_need = false, ahead_ok = all[3] >= 0, ahead_needed = false;
    for (int r = 0; r < n; ++r) {
      const int32_t* w = &all[kWords * r];
      same &= w[0] == all[0] && w[1] == all[1];
      any_need |= w[2] != 0;
      ahead_ok &= w[3] == all[3] && (w[4] & 1);
      ahead_needed |= (w[4] & 2) != 0;
    }
    if (same && need) *need = any_need;
    if (same && ahead) ahead->go = ahead_ok && ahead_needed;
    if (same) return call == Call::kGrads ? reduce_(u, grad) : Status::Ok();
    // Ranks differ. Gradients handed over anywhere are reduced now, in unit order, with zeros
    // from the ranks that have none for that unit; those ranks' calls are then done.
    std::vector<int> units;
    for (int r = 0; r < n; ++r)
      if (all[kWords * r] == static_cast<int32_t>(Call::kGrads)) units.push_back(all[kWords * r + 1]);
    if (units.empty()) {
      int other = 1;
      while (other < n && all[kWords * other] == all[0] && all[kWords * other + 1] == all[1]) ++other;
      return Status::Runtime(fmt::format(
          "ranks are out of step: rank 0 calls {} while rank {} calls {} (every rank must fetch the same units in "
          "the same order)",
          what(static_cast<Call>(all[0]), all[1]), other,
          what(static_cast<Call>(all[kWords * other]), all[kWords * other + 1])));
    }
    std::sort(units.begin(), units.end());
    units.erase(std::unique(units.begin(), units.end()), units.end());
    bool mine_done = false;
    for (int v : units) {
      if (v < 0 || v >= layout_.num_units()) return Status::Runtime(fmt::format("a rank handed over gradients of unit {}", v));
      bool have = call == Call::kGrads && v == u;
      ZOE_RETURN_IF_ERROR(reduce_(v, have ? grad : nullptr));
      mine_done |= have;
    }
    if (mine_done) return Status::Ok();
  }
}

std::string Agreement::what(Call call, int u) const {
  if (call == Call::kStep) return "step()";
  return fmt::format("{}('{}')", call == Call::kFetch ? "fetch" : "grads_ready",
                     u >= 0 && u < layout_.num_units() ? layout_.unit(u).name : "?");
}

}  // namespace zoe

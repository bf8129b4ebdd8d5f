// RankUnitMover: the engine's UnitMover. Loads come from RankState's tiers (ChunkLoad), gathers
// run on the engine's communicator or its communication thread (CommWorker), the agreement is the
// engine's (Agreement), and "updated" is the optimizer's pass's progress.
#pragma once
#include <memory>

#include "comm/comm.h"
#include "sched/agreement.h"
#include "sched/comm_worker.h"
#include "sched/grad_reducer.h"
#include "sched/optimizer/optimizer_pass.h"
#include "sched/rank_state.h"
#include "sched/stage3/unit_mover.h"

namespace zoe {

class RankUnitMover final : public UnitMover {
 public:
  RankUnitMover(RankState& state, OptimizerPass& pass, Agreement& agreement, GradReducer& reducer, Comm& comm)
      : s_(state), pass_(pass), agreement_(agreement), reducer_(reducer), comm_(comm) {}
  // Gathers ahead run on `worker` (not owned; null: none run ahead).
  void set_worker(CommWorker* worker) { worker_ = worker; }

  Status agree_fetch(int u, bool* need, AheadGather* ahead) override {
    return agreement_.agree(Agreement::Call::kFetch, u, nullptr, need, ahead);
  }
  bool updated(int u) const override { return pass_.updated(u); }
  Status wait_updated(int u) override { return pass_.wait_for_unit(u); }
  std::unique_ptr<UnitLoad> load(int u, const Buffer& dst) override { return s_.chunk_load(u, dst); }
  Status gather(int u, const Buffer& buf) override;
  bool gathers_ahead() const override { return worker_ != nullptr; }
  uint64_t gather_ahead(int u, UnitLoad* load, const Buffer& buf) override;
  Status wait_gather(int u, uint64_t ticket) override;
  Status finish_reductions() override { return reducer_.finish(); }

 private:
  size_t chunk_bytes(int u) const { return s_.layout().slot(u).chunk * s_.wsize(); }
  const std::string& name(int u) const { return s_.layout().unit(u).name; }

  RankState& s_;
  OptimizerPass& pass_;
  Agreement& agreement_;
  GradReducer& reducer_;
  Comm& comm_;
  CommWorker* worker_ = nullptr;
};

}  // namespace zoe

// Stage 3's mechanism on a virtual clock, under the real UnitScheduler: the compute advances
// `now`; one I/O worker serves chunk loads in the order they start, each unit's load taking its
// own time; finishing a load waits for it. One rank: the gather is in the load's time, the
// optimizer has always written the unit. `zoe plan` times a step with it (plan/virtual_step.h);
// prefetch_policy_test drives the scheduler's decisions with it (`mark`: a finished load writes its
// unit's number at the front of its destination, so a fetch's data says whose chunk landed there).
#pragma once
#include <memory>
#include <vector>

#include "sched/stage3/unit_load.h"
#include "sched/stage3/unit_mover.h"

namespace zoe {

struct VirtualClock {
  double now = 0, io_free = 0;
};

class VirtualMover final : public UnitMover {
 public:
  VirtualMover(VirtualClock& clock, std::vector<double> load_s, std::vector<bool> memory_parts, bool mark = false)
      : clock(clock), load_s(std::move(load_s)), memory_parts(std::move(memory_parts)), mark(mark) {}
  VirtualClock& clock;
  std::vector<double> load_s;      // per unit
  std::vector<bool> memory_parts;  // per unit: a part in memory (the load needs its buffer: not staged)
  bool mark;
  std::vector<int> loads;          // units, in the order their reads started
  int gathers = 0;

  Status agree_fetch(int, bool*, AheadGather* ahead) override {
    ahead->go = ahead->v >= 0 && ahead->ready && ahead->needs;
    return Status::Ok();
  }
  bool updated(int) const override { return true; }
  Status wait_updated(int) override { return Status::Ok(); }
  std::unique_ptr<UnitLoad> load(int u, const Buffer& dst) override;
  Status gather(int, const Buffer&) override {
    ++gathers;
    return Status::Ok();
  }
  bool gathers_ahead() const override { return false; }
  uint64_t gather_ahead(int, UnitLoad*, const Buffer&) override { return 0; }
  Status wait_gather(int, uint64_t) override { return Status::Ok(); }
  Status finish_reductions() override { return Status::Ok(); }
};

}  // namespace zoe

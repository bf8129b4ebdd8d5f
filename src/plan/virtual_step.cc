#include "plan/virtual_step.h"

#include <algorithm>

#include "cpu/cpu_device.h"
#include "plan/virtual_mover.h"
#include "sched/stage3/unit_scheduler.h"

namespace zoe {
namespace {

// One micro-step along in.fetches.
Result<VirtualStepResult> one_step(const VirtualStepInput& in, VirtualClock& clock, VirtualMover& mover,
                                   UnitScheduler& s) {
  clock = VirtualClock{};
  mover.loads.clear();
  ZOE_RETURN_IF_ERROR(s.unload_all());
  s.begin_step();
  s.prefetch();
  VirtualStepResult r;
  bool backward = false;
  for (const PlanFetch& f : in.fetches) {
    if (f.backward && !backward) backward = true, r.forward_s = clock.now;
    ZOE_RETURN_IF_ERROR(s.fetch(f.unit).status());
    clock.now += in.fetch_overhead_s + f.compute_s;
    ZOE_RETURN_IF_ERROR(s.release(f.unit));
  }
  r.step_s = clock.now;
  r.loaded = mover.loads;
  r.loads = static_cast<int64_t>(mover.loads.size());
  return r;
}

}  // namespace

Result<VirtualStepResult> run_virtual_step(const VirtualStepInput& in) {
  const size_t n = in.unit_elems.size();
  if (in.load_s.size() != n || in.memory_parts.size() != n)
    return Status::Invalid("a virtual step needs a load time and a placement for every unit");
  CpuDevice dev(in.budget, 1 << 20);
  VirtualClock clock;
  VirtualMover mover(clock, in.load_s, in.memory_parts);
  UnitScheduler s(dev, mover, in.unit_elems, in.wsize, in.limits, in.budget, false);
  s.set_reserve(in.reserve);
  Buffer state, acts;
  if (in.state_bytes) {
    ZOE_ASSIGN_OR_RETURN(state, dev.alloc(in.state_bytes, Tier::kDevice, Kind::kParam));
  }
  if (in.activation_bytes) {
    ZOE_ASSIGN_OR_RETURN(acts, dev.alloc(in.activation_bytes, Tier::kDevice, Kind::kActivation));
  }
  auto first = one_step(in, clock, mover, s);
  Result<VirtualStepResult> second = first.ok() ? one_step(in, clock, mover, s) : first;
  s.clear();
  dev.free(acts);
  dev.free(state);
  return second;
}

}  // namespace zoe

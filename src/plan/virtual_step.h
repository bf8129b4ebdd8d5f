// A micro-step's fetches driven through stage 3's own UnitScheduler and PrefetchPolicy on a
// virtual clock: the compute advances the clock, one I/O worker serves the chunk loads in the
// order the scheduler starts them, a fetch waits for its load. The device is a CPU device's
// arena of the job's budget (reserved, never touched) holding the state and the activations the
// job holds, so keeping, loading ahead, staging and eviction see the room they would see.
#pragma once
#include <cstdint>
#include <vector>

#include "plan/step_model.h"
#include "zoe/status.h"
#include "sched/stage3/prefetch_policy.h"

namespace zoe {

struct VirtualStepInput {
  std::vector<int64_t> unit_elems;  // gathered elements of each unit
  size_t wsize = 2;                 // bytes per gathered element
  std::vector<double> load_s;       // per unit: its chunk from its home tier plus its all-gather
  std::vector<bool> memory_parts;   // per unit: a part in host or device memory (cannot be staged)
  PrefetchLimits limits;
  uint64_t budget = 0;              // the device's
  uint64_t state_bytes = 0;         // persistent state on the device
  uint64_t activation_bytes = 0;    // the model's, held through the micro-step
  uint64_t reserve = 0;             // what the engine keeps free (the largest unit in flight)
  std::vector<PlanFetch> fetches;
  double fetch_overhead_s = 0;      // each fetch's cost to the caller, beside its load
};

struct VirtualStepResult {
  double step_s = 0;        // the micro-step, loads and compute
  double forward_s = 0;     // when its first backward fetch began
  int64_t loads = 0;        // chunk loads the step made (kept units make none)
  std::vector<int> loaded;  // which units, in order
};

// The second of two micro-steps (the first records the unit order the scheduler then follows).
// Out of memory on the virtual device is an error: the configuration does not fit.
Result<VirtualStepResult> run_virtual_step(const VirtualStepInput& in);

}  // namespace zoe

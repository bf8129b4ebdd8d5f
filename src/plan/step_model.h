// StepModel: one optimizer step of a job under one configuration, predicted from measured rates.
// Bytes per tier are the ledger's (sched/memory_estimate.h, the split StateArray makes by
// `ratio`), the device's need is the engine's refusal check plus the model's measured
// activations; stage 3's parameter loads run through the engine's own UnitScheduler and
// PrefetchPolicy on a virtual clock (plan/virtual_step.h) with this job's compute and load times,
// not through a second model of the schedule. Pure: rates in, a prediction out.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/offload_config.h"
#include "sched/stage3/prefetch_policy.h"
#include "zoe/dtype.h"
#include "zoe/ledger.h"

namespace zoe {

// One fetch of a micro-step (forward, then backward) and the compute the model runs on it.
struct PlanFetch {
  int unit = 0;
  double compute_s = 0;
  bool backward = false;
};

// A micro-step of one rank at one micro-batch size, as measured (bench/plan_calibration: the
// model run resident, its gradients' hand-over included) or given (tests).
struct MicroStepWork {
  std::vector<PlanFetch> fetches;  // in the model's order; a unit may appear more than once
  uint64_t activation_bytes = 0;   // device memory beside the state at its peak (activations, scratch)
  int64_t tokens = 0;              // per rank
  // On a device of its own (a GPU): what its step costs beyond Adam's elements, a unit (the norm's
  // and the update's launches and their waits), measured with the model. 0 on the CPU device,
  // whose measured Adam rate holds it.
  double step_overhead_per_unit_s = 0;
};

// The machine, measured. Bytes per second; Adam in elements per second.
struct PlanRates {
  double adam_elems_per_s = 0;   // the CPU Adam (the CPU device runs the same kernel for device state)
  double nvme_read_Bps = 0, nvme_write_Bps = 0;
  // The optimizer's pass over NVMe state, measured through the engine (reads and write-backs at
  // once, Adam, checksums): seconds an element; 0: from the read and write rates. And the
  // parameters' reads at a fetch (0: nvme_read_Bps); the depth both were best at.
  double nvme_pass_s_per_elem = 0, param_read_Bps = 0;
  unsigned aio_queue_depth = 8;
  double host_copy_Bps = 0;      // host <-> device and device-side copies, conversions
  double gather_busbw_Bps = 0;   // all-gather, reduce-scatter bus bandwidth (more than one rank)
  double reduce_busbw_Bps = 0;
  // The device computes on the host's cores (the CPU device): the model's compute, the CPU Adam
  // and host copies take turns on them, so only the disk overlaps with them.
  bool compute_on_host_cores = true;
  // A device of its own (a GPU: compute_on_host_cores false): its Adam over state in its memory
  // (elements a second), the link's rates each way between it and pinned host memory, and copies
  // within its memory. 0: the CPU device's (adam_elems_per_s, host_copy_Bps).
  double device_adam_elems_per_s = 0;
  double h2d_Bps = 0, d2h_Bps = 0, device_copy_Bps = 0;
  // What a stage-3 fetch costs the caller beyond its chunk's copy (the agreement, the scheduler's
  // bookkeeping), measured as a stage-3 micro-step against a stage-0 one.
  double fetch_overhead_s = 0;
  // Measured on the job's ranks at its width, that cost holds the fetch's all-gather and its
  // gradient's reduce-scatter too: then they are not added again from the bus bandwidth.
  bool fetch_overhead_has_collectives = false;
};

// The knobs a plan chooses.
struct PlanKnobs {
  int stage = 0;
  OffloadDevice optimizer = OffloadDevice::kNone, param = OffloadDevice::kNone;
  double optimizer_ratio = 1, param_ratio = 1;
  int64_t sub_group_size = 1'000'000'000;
  PrefetchLimits prefetch{50'000'000, 1'000'000'000, 1'000'000'000};
  int micro_batch = 1, accumulation = 1;
  bool activation_checkpointing = false;
  bool update_in_backward = false;  // zoe.update_in_backward: the pass runs beside the backward
  uint32_t aio_block_size = 1u << 20;
  unsigned aio_queue_depth = 8;
  bool operator==(const PlanKnobs&) const = default;
};

// What the job fixes: its units, ranks, dtype and budgets.
struct PlanJob {
  std::vector<int64_t> unit_elems;
  int ranks = 1;
  DType dtype = DType::kBF16;
  uint64_t device_budget = 0, host_budget = 0;
  uint64_t nvme_free = 0;  // bytes free on the swap path's file system (0: no NVMe tier)
  // Where the communicator that reduces holds one largest reduction's staging at 2+ ranks (the
  // engine books it at start-up): host memory over MPI, device memory for NCCL's rank-order sum,
  // nowhere for NCCL's own reduce-scatter (zoe.nccl_reduce_scatter).
  std::optional<Tier> staging = Tier::kHost;
  // zero_optimization.overlap_comm: at stages 2-3 the engine reduces on a communication thread
  // where the device holds one more reduction buffer (comm_thread_bytes) beside its reserve.
  bool overlap_comm = true;
};

struct StepPrediction {
  bool fits = false;
  std::string why;                              // when it does not fit: what does not, by how much
  std::array<uint64_t, kNumTiers> bytes{};      // per rank: device need (state, units in flight,
                                                // activations), host (state, pinned pool), nvme
  double compute_s = 0;   // the micro-steps' compute alone
  double micro_s = 0;     // the micro-steps with their loads, gathers and reductions
  double optimizer_s = 0; // the optimizer's pass (stage 3: overlapped with the next forward)
  double disk_s = 0;      // every NVMe byte of the step at the measured rates
  double step_s = 0;
  double tokens_per_s = 0;
  std::string bound;      // compute, loads, optimizer, disk or comm: what the step waits on most
};

// The per-rank state bytes by tier of a layout of `units` over job.ranks under k (exact: padding,
// ratio split), without the units in flight or the activations.
std::array<uint64_t, kNumTiers> state_bytes(const PlanJob& job, const PlanKnobs& k);

// The pinned pool an NVMe tier takes out of the host budget (RankState's rule).
uint64_t pinned_pool_bytes(const PlanJob& job, const PlanKnobs& k);

StepPrediction predict_step(const PlanJob& job, const PlanKnobs& k, const MicroStepWork& work, const PlanRates& r);

}  // namespace zoe

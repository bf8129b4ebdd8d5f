// The search behind `zoe plan`: every configuration of the knobs (stage, offload homes and
// ratios, sub-group size, prefetch limits, micro-batch with accumulation at a fixed global batch,
// activation checkpointing) predicted by the step model; what does not fit is kept with its
// reason, the rest ranked by predicted step time.
#pragma once
#include <functional>
#include <utility>
#include <vector>

#include "plan/step_model.h"
#include "zoe/status.h"

namespace zoe {

struct PlanSpace {
  int sequences_per_rank = 1;             // micro-batch x accumulation: the global batch / ranks
  int most_micro_batch = 64;              // micro-batches above this are not tried
  // The (micro-batch, checkpointing) pairs to try, of those micro-batches that divide
  // sequences_per_rank; empty: every divisor with each of `checkpointing`. A described model
  // (plan/described_model.h) offers the pairs it was measured at.
  std::vector<std::pair<int, bool>> micro_steps;
  bool nvme = false;                      // an NVMe path is given: its tier may be used
  std::vector<int> stages = {0, 1, 2, 3};
  std::vector<double> ratios = {1.0, 0.5};  // offloaded fraction of a home that is not the device
  std::vector<int64_t> sub_group_sizes = {100'000'000, 1'000'000'000};
  std::vector<PrefetchLimits> prefetch = {{50'000'000, 1'000'000'000, 1'000'000'000},
                                          {0, 1'000'000'000, 0}};
  std::vector<bool> checkpointing = {false, true};
  // zoe.update_in_backward, tried at stages 0-2 with an offloaded optimizer: on a device of its
  // own (a GPU) the CPU's pass then runs beside the backward; on the CPU device they would take
  // turns on the same cores, so it is not offered there.
  std::vector<bool> update_in_backward = {false};
  uint32_t aio_block_size = 1u << 20;    // the NVMe store's best case (calibration)
  unsigned aio_queue_depth = 8;
};

// The model's micro-step at a micro-batch size and checkpointing choice (calibration measures it).
using MicroStepFor = std::function<Result<MicroStepWork>(int micro_batch, bool checkpointing)>;

struct PlanChoice {
  PlanKnobs knobs;
  StepPrediction prediction;
};

struct PlanResult {
  std::vector<PlanChoice> fitting;  // fastest first
  std::vector<PlanChoice> refused;  // each with prediction.why
};

Result<PlanResult> search_plans(const PlanJob& job, const PlanSpace& space, const MicroStepFor& work,
                                const PlanRates& rates);

// When nothing fits: the smallest change of each kind that makes some configuration fit, with
// the fastest configuration it lets fit. Kinds, each tried alone: the device budget, the host
// budget, an NVMe tier (a path, or more free space on the one given), more ranks (the same
// micro-batches per rank; powers of two up to 4096 times the job's). A budget or free space is
// the least that some configuration needs (less fits none); ranks, the fewest that fit.
struct PlanChange {
  enum class Kind { kDeviceBudget, kHostBudget, kNvme, kRanks } kind;
  uint64_t value = 0;  // bytes (budgets, NVMe free space) or ranks
  PlanChoice choice;
};
// `now`: search_plans' result for the job as it is (the caller's).
Result<std::vector<PlanChange>> smallest_changes(const PlanJob& job, const PlanSpace& space, const MicroStepFor& work,
                                                 const PlanRates& rates, const PlanResult& now);

// Every knob setting the space holds (those that make sense together: offloaded parameters
// only at stage 3, a ratio only for an offloaded home, one sub-group size without an offloaded
// optimizer, one prefetch setting below stage 3).
std::vector<PlanKnobs> plan_grid(const PlanSpace& space);

}  // namespace zoe

// GradReducer: a step's gradients from the model's hand-overs to this rank's reduced shard.
//
// Sharded gradients (stages 2-3) are reduce-scattered when each unit is handed over, on the
// communication thread where there is one (overlap_comm), the backward going on meanwhile; at
// most one unit's reduction, of at most reduce_bucket_size elements, stays in flight after a
// hand-over. Replicated gradients (stages 0-1) accumulate locally and are reduce-scattered at
// the step, unit by unit, so the sums are the same calls in the same order.
//
// A sharded hand-over is reduced once the ranks agree (Agreement, which also reduces, with zeros
// here, what other ranks hand over while this one calls something else). With the optimizer
// offloaded the owned gradient chunk lives in pinned host memory and the same job copies (or
// adds) the reduced chunk there. At one rank a step's first reduction is the conversion straight
// into the owned chunk, which also makes the unit's share of the norm (convert_sum_squares).
//
// Threads: the caller's only; jobs it submits run on the CommWorker, which it waits for.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "comm/comm.h"
#include "sched/agreement.h"
#include "sched/comm_worker.h"
#include "sched/optimizer/optimizer_pass.h"
#include "sched/rank_state.h"
#include "zoe/device.h"

namespace zoe {

class GradReducer {
 public:
  // pass: the optimizer's; a unit's gradient is rewritten only once the pass no longer reads it.
  // agreement: the engine's; its reductions are this reducer's from now on.
  GradReducer(RankState& state, OptimizerPass& pass, Agreement& agreement, Device& dev, Comm& comm);
  ~GradReducer();  // waits for the reductions in flight
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;
  Status allocate();
  // Reductions run on `worker` (not owned; null: at the hand-over, on the caller's thread).
  void set_worker(CommWorker* worker) { worker_ = worker; }
  // What frees device memory the engine holds but does not need now (idle gather buffers, units
  // kept for reuse): tried when a reduction buffer finds the device full.
  void set_make_room(std::function<Status()> make_room) { make_room_ = std::move(make_room); }

  // grads_ready(u, grad): accumulate (replicated) or agree and reduce (sharded).
  Status hand_over(int u, const float* grad);
  // Waits for every reduction in flight; the first error (every buffer goes back anyway).
  Status finish() { return reap(0, -1); }
  // At step(), in this order: the units each rank handed over must be the same (else all fail
  // alike, gradients dropped); units without a gradient contribute zeros and replicated ones are
  // reduced now (*handed: this rank's hand-overs); then the counters start afresh (drop) and
  // the squared norm of the owned shard, summed over ranks with *handed, is what the step clips by.
  Status check_matching();
  Status reduce_rest(double* handed);
  void drop();
  Result<double> owned_sumsq(double* handed);
  // Units whose share of the norm their hand-over made (read by tests).
  int64_t units_summed_at_hand_over() const { return summed_at_hand_over_; }

  int64_t async_reductions() const { return async_; }  // run on the communication thread so far

 private:
  // An allocation that finds the device full is tried once more after the reductions in flight
  // have given their buffers back.
  Result<Buffer> after_reductions_if_full(const std::function<Result<Buffer>()>& alloc);
  Status reduce_sharded(int u, const float* grad);  // grad null: contribute zeros
  Status reduce_alone(int u, const float* grad);    // one rank: straight into the owned chunk
  CommWorker::Job reduction_job(int u, const Buffer& buf, bool first);
  Status reduce_replicated(int u);  // RS of the accumulated full gradient into the owned chunk
  // Waits for the oldest reductions until at most `units` of them and `elems` elements are left.
  Status reap(size_t units, int64_t elems);
  const std::string& name(int u) const { return s_.layout().unit(u).name; }

  RankState& s_;
  OptimizerPass& pass_;
  Agreement& agreement_;
  Device& dev_;
  Comm& comm_;
  CommWorker* worker_ = nullptr;
  std::function<Status()> make_room_;
  struct Reduction {
    uint64_t ticket;
    Buffer buf;  // the unit's gradient in the gradient dtype, N chunks
    int64_t elems;
    int u;
    bool last;  // the step's last reduction of u: its owned chunk is final once done
  };
  std::deque<Reduction> reducing_;
  int64_t reducing_elems_ = 0;
  int64_t async_ = 0;
  int64_t summed_at_hand_over_ = 0;
  Buffer sumsq_;                 // the squared norm, summed on the device, read back once a step
  // Per unit, the sum of squares of its owned chunk where the hand-over made it (reduce_alone,
  // the step's only reduction) and nothing has written the chunk since: summed_[u].
  Buffer unit_sumsq_;
  std::vector<uint8_t> summed_;
  std::vector<int> local_seen_;   // replicated grads: micro-steps that accumulated unit u locally
  std::vector<int> reduced_;      // sharded grads: reductions into unit u's owned chunk this step
  std::vector<int> handed_here_;  // grads_ready calls this rank made for unit u this step
};

}  // namespace zoe

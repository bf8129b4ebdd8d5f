// ZeroEngine: the one ZeRO pipeline behind the unit API (zoe/engine.h). It coordinates this
// rank's state (RankState: the arrays, their tiers, the NVMe stores), the optimizer's pass
// (OptimizerPass, on its own thread), the gradients' reduction (GradReducer) and stage 3's
// gathered units (UnitScheduler, moving them through RankUnitMover).
// One step: grads_ready reduce-scatters each unit's gradient into its owner chunk right away when
// gradients are sharded, else accumulates locally and the reduce-scatter runs in step(); the
// global norm is summed from the owned chunks; unsharded optimizer state all-gathers the reduced
// gradient (RS + AG = all-reduce); Adam steps the optimizer range; replicated parameters are
// all-gathered from their owners; sharded parameters are gathered by the next fetch().
#pragma once
#include <optional>
#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "sched/engine_options.h"
#include "sched/agreement.h"
#include "sched/comm_worker.h"
#include "sched/grad_reducer.h"
#include "sched/loss_scaler.h"
#include "sched/optimizer/optimizer_pass.h"
#include "sched/rank_state.h"
#include "sched/stage3/rank_unit_mover.h"
#include "sched/shard_layout.h"
#include "sched/stage_plan.h"
#include "sched/stage3/unit_scheduler.h"
#include "zoe/device.h"
#include "zoe/engine.h"

namespace zoe {

class ZeroEngine final : public Engine {
 public:
  // An engine with its state allocated. nvme_env: what the NVMe tier asks of the operating system
  // (null: the real io_uring environment); tests pass one that injects faults.
  static Result<std::unique_ptr<ZeroEngine>> create(const EngineOptions& o, Device& d, Comm& comm,
                                                    std::vector<UnitSpec> units, NvmeEnv* nvme_env = nullptr);
  // Unallocated (allocate() next): for tests that look at a failed allocation.
  ZeroEngine(const EngineOptions& o, Device& d, Comm& comm, std::vector<UnitSpec> units, NvmeEnv* nvme_env = nullptr);
  ~ZeroEngine() override;
  Status allocate();

  Device& device() override { return dev_; }
  int num_units() const override { return layout_.num_units(); }
  const UnitSpec& unit(int u) const override { return layout_.unit(u); }
  int64_t params() const override { return layout_.params(); }
  const ShardLayout& layout() const { return layout_; }

  Status set_params(int u, const float* values) override;
  Result<ParamView> fetch(int u) override;
  Status release(int u) override;
  Status grads_ready(int u, const float* grad) override;
  Result<StepResult> step(double lr) override;
  Status update_during_backward(double lr) override;
  Result<StepResult> flush() override;
  void require_matching_grads(bool on) override { require_matching_ = on; }

  void set_activation_bytes(uint64_t bytes) override;
  double loss_scale() const override { return scaler_.scale(); }
  int64_t steps_applied() const override { return steps_applied_; }
  OwnedRange owned_range(int u) const override { return {state_.opt_begin(u), state_.opt_end(u)}; }
  Status read_owned(int u, OwnedKind k, int64_t begin, int64_t end, float* dst) override;
  Status write_owned(int u, OwnedKind k, int64_t begin, int64_t end, const float* src) override;
  // The optimizer's sub-group (elements) and the pinned pool's size; 0 without NVMe state.
  int64_t sub_group_elems() const { return state_.group_elems(); }
  Status commit_owned_state() override;
  NvmeBytes nvme_bytes() const override {
    NvmeStore::Traffic t = state_.nvme_traffic();
    return {t.read_bytes, t.written_bytes};
  }
  void wait_nvme_idle() override { state_.wait_nvme_idle(); }

  // The units' fetch order of the last complete step (stage 3; empty before one).
  const std::vector<int>& unit_order() const { return units_.plan(); }

  // What stage 3's scheduler and the engine's workers did since the engine was made.
  struct SchedStats : UnitScheduler::Stats {
    int64_t reductions_async = 0;  // gradient reductions run on the communication thread
    int64_t norm_shares_at_hand_over = 0;  // units whose share of the norm their hand-over made
    int64_t adam_hashed_blocks = 0;  // NVMe blocks whose sums the host Adam made (window_sums.h)
    int64_t units_updated_in_backward = 0;  // released to the update before step() (update_in_backward)
    int64_t updates_taken_back = 0;  // such updates the global norm overruled: taken back, redone or skipped
    uint64_t nvme_read_bytes = 0;    // what the NVMe stores' devices moved (NvmeStore::traffic)
    uint64_t nvme_written_bytes = 0;
    uint64_t nvme_hashed_bytes = 0;  // block sums the NVMe I/O threads made or checked (not Adam's)
    uint64_t nvme_forwarded_bytes = 0;  // reads served from pending writes' memory (not the device)
  };
  SchedStats sched_stats() const;
  // What a checkpoint carries besides the state arrays (ckpt/manifest.h TrainState): the steps
  // applied and the loss scaler's state. Not in the Engine a model sees.
  void restore_counters(int64_t steps, double scale, int64_t good, int hyst);
  void scaler_state(int64_t* good, int* hyst) const;

 private:
  char* grad_ptr(int64_t elem) const { return state_.grad_ptr(elem); }
  // Takes back the update begun in the backward with early_scale_; then steps again with
  // grad_scale (no value: the step is skipped). False where it had stepped nothing (it just ends).
  Result<bool> take_back_early_update(double lr, std::optional<double> grad_scale, int64_t step);
  AdamHyper adam_hyper(double lr, double grad_scale, int64_t step) const;

  struct OwnedPlace {
    StateArray* array;
    DType dtype;
    int64_t index;  // of element `begin`
  };
  Result<OwnedPlace> owned_place(const char* op, int u, OwnedKind k, int64_t begin, int64_t end);

  Status check_state_fits();                // start-up: the state and one unit fit the budget
  Status check_host_fits();                 // start-up: the state in host memory fits its budget
  Status check_device_fits();               // start-up: the largest unit fits next to the state
  Status start_comm_worker();               // start-up: comm_worker_ where overlap_comm can run
  Status reserve_staging(Comm& c);          // start-up: c's staging for the largest reduction
  uint64_t unit_device_need(int u) const;   // device bytes of one unit in flight
  std::string ways_to_fit(uint64_t need, uint64_t left) const;  // check_state_fits' suggestions
  Status unload_all();                      // before the parameters change (stage 3's units)
  Result<StepResult> apply_step(double lr, bool early);
  double mean_unscaled() const;  // the gradients' scale: 1 / (loss scale x ranks x micro-steps)
  // The optimizer's pass runs on its own thread (pass_); in_backward: gated (update_during_backward).
  void start_update(double lr, double grad_scale, int64_t step, bool in_backward);
  Status wait_update();                    // the whole pass
  Status gather_replicated_params();

  EngineOptions cfg_;
  Device& dev_;
  Comm& comm_;
  ShardLayout layout_;
  StagePlan plan_;
  DType dtype_;     // weights
  size_t wsize_;
  DType gdtype_;    // gradients: data_types.grad_accum_dtype (default: the weight dtype)
  size_t gsize_;
  LossScaler scaler_;
  RankState state_;
  OptimizerPass pass_;  // after the state it steps: stops before the state goes
  Agreement agreement_;
  GradReducer reducer_;  // after the agreement whose reductions it makes
  RankUnitMover mover_;
  UnitScheduler units_;  // after the mover it drives
  bool told_deviation_ = false;
  // The communication thread (its own duplicate of comm_): reductions and gathers ahead.
  std::unique_ptr<CommWorker> comm_worker_;
  StepResult pending_;      // the last step's result, completed by flush()
  bool pending_open_ = false;
  bool require_matching_ = false;
  int64_t steps_applied_ = 0;
  uint64_t activation_bytes_ = 0;
  std::optional<double> early_lr_;  // update_during_backward's lr, until step()
  float early_scale_ = 1.0f;         // the gradient scale the update begun in the backward assumed
  int64_t taken_back_ = 0;
  // Whether the next step's update begins in the backward: while the last step's norm would have
  // confirmed it (a step clipped or overflowed makes the next one wait for its norm).
  bool speculate_next_ = true;
  bool speculating_ = false;  // this step's
};

}  // namespace zoe

// ZeroEngine: the one ZeRO pipeline behind the unit API (zoe/engine.h).
//
// Storage per rank (P_pad, S from ShardLayout; w = bytes of the weight dtype):
//   param      : shard_params ? S : P_pad elements of dtype      (home tier: offload_param)
//   grad       : shard_grads  ? S : P_pad elements of dtype      (device)
//   master/m/v : shard_optimizer ? S : P_pad fp32 each           (home tier: offload_optimizer)
//                (no separate master in fp32 training: the param storage is the master)
// One step: grads_ready reduce-scatters each unit's gradient into its owner chunk right away when
// gradients are sharded, else accumulates locally and the reduce-scatter runs in step(); the
// global norm is summed from the owned chunks; unsharded optimizer state all-gathers the reduced
// gradient (RS + AG = all-reduce); Adam steps the optimizer range; replicated parameters are
// all-gathered from their owners; sharded parameters are gathered by the next fetch().
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "common/config.h"
#include "sched/loss_scaler.h"
#include "sched/shard_layout.h"
#include "sched/stage_plan.h"
#include "zoe/device.h"
#include "zoe/engine.h"

namespace zoe {

class ZeroEngine final : public Engine {
 public:
  ZeroEngine(const Config& c, Device& d, Comm& comm, std::vector<UnitSpec> units);
  ~ZeroEngine() override;
  Status allocate();

  int num_units() const override { return layout_.num_units(); }
  const UnitSpec& unit(int u) const override { return layout_.unit(u); }
  int64_t params() const override { return layout_.params(); }
  const ShardLayout& layout() const { return layout_; }

  Status set_params(int u, const float* values) override;
  Result<ParamView> fetch(int u) override;
  Status release(int u) override;
  Status grads_ready(int u, const float* grad) override;
  Result<StepResult> step(double lr) override;

  void set_activation_bytes(uint64_t bytes) override;
  double loss_scale() const override { return scaler_.scale(); }
  int64_t steps_applied() const override { return steps_applied_; }
  OwnedState owned_state(int u) override;
  Status commit_owned_state() override;
  void restore_counters(int64_t steps, double scale, int64_t good, int hyst) override;
  void scaler_state(int64_t* good, int* hyst) const override;

 private:
  // Where unit u's pieces live, in elements from each storage's start.
  int64_t param_offset(int u) const;       // the unit's params (full) or its chunk (sharded)
  int64_t grad_owned_offset(int u) const;  // the reduced owned chunk of the gradient
  int64_t opt_offset(int u) const;         // start of the optimizer range
  int64_t opt_begin(int u) const;          // optimizer range inside the unit, unit-relative
  int64_t opt_end(int u) const;
  char* param_ptr(int64_t elem) const { return param_.as<char>() + elem * wsize_; }
  char* grad_ptr(int64_t elem) const { return grad_.as<char>() + elem * gsize_; }

  // Every collective the engine starts is preceded by an agreement on what it is (control
  // traffic), so ranks whose models call the unit API differently never mismatch collectives:
  // gradients one rank hands over are reduced with zeros from ranks that have none for that
  // unit; any other disagreement is an error on every rank, never a hang.
  enum class OpKind : int32_t { kFetch = 1, kGrads = 2, kStep = 3 };
  Status sync_point(OpKind kind, int u, const float* grad);
  Status reduce_sharded_grad(int u, const float* grad);  // grad null: contribute zeros
  Status reduce_unit_grad(int u, const void* full_grad);  // RS into the owned chunk
  Result<double> owned_grad_sumsq();
  Status apply_adam(double lr, double grad_scale, uint64_t* nonfinite);
  Status gather_replicated_params();

  Config cfg_;
  Device& dev_;
  Comm& comm_;
  ShardLayout layout_;
  StagePlan plan_;
  DType dtype_;     // weights
  size_t wsize_;
  DType gdtype_;    // gradients: data_types.grad_accum_dtype (default: the weight dtype)
  size_t gsize_;
  LossScaler scaler_;
  Buffer param_, grad_, master_, exp_avg_, exp_avg_sq_;
  struct Gathered {
    Buffer buf;
    int refs = 0;
  };
  std::vector<Gathered> gathered_;
  std::vector<int> local_seen_;    // replicated grads: micro-steps that accumulated unit u locally
  std::vector<int> reduced_;       // sharded grads: reductions into unit u's owned chunk this step
  int64_t steps_applied_ = 0;
  uint64_t activation_bytes_ = 0;
};

}  // namespace zoe

// RankState: this rank's persistent model state and where it lives. The four StateArrays (the
// parameters, the fp32 master, exp_avg and exp_avg_sq), the gradient buffer, and the NVMe tier
// behind them (one store per nvme_path, and the pinned pool the stores and the optimizer's
// windows lease from). It also says where each unit's pieces are in those arrays (ShardLayout
// under the StagePlan), so the engine, the optimizer's pass and the gradient reducer share one
// definition of that arithmetic.
//
// Storage per rank (P_pad, S from ShardLayout; w = bytes of the weight dtype):
//   param      : shard_params ? S : P_pad elements of dtype      (home: offload_param)
//   grad       : shard_grads  ? S : P_pad elements of grad dtype (device; pinned host memory
//                when sharded and offload_optimizer is on: the host Adam reads it there)
//   master/m/v : shard_optimizer ? S : P_pad fp32 each           (home: offload_optimizer)
//                (no separate master in fp32 training: the param storage is the master)
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sched/engine_options.h"
#include "nvme/nvme_store.h"
#include "nvme/pinned_pool.h"
#include "sched/stage3/window_retirement.h"
#include "sched/stage3/chunk_load.h"
#include "sched/shard_layout.h"
#include "sched/stage_plan.h"
#include "sched/state_array.h"
#include "zoe/device.h"
#include "zoe/engine.h"

namespace zoe {

class RankState {
 public:
  // nvme_env: the NVMe stores' environment (null: the real one).
  RankState(const EngineOptions& c, Device& d, const ShardLayout& layout, StagePlan plan, int rank, NvmeEnv* nvme_env);
  ~RankState();
  RankState(const RankState&) = delete;
  RankState& operator=(const RankState&) = delete;

  // The NVMe stores and the pinned pool (when a home is on NVMe; `job` names their swap
  // directories, the same on every rank), then the arrays and the gradient buffer.
  Status allocate(const std::string& job);

  const EngineOptions& config() const { return cfg_; }
  const StagePlan& plan() const { return plan_; }
  const ShardLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  DType dtype() const { return cfg_.dtype; }  // the weights'
  size_t wsize() const { return wsize_; }
  DType gdtype() const { return gdtype_; }    // the gradients': data_types.grad_accum_dtype
  size_t gsize() const { return gsize_; }

  // Where unit u's pieces live, in elements from each storage's start.
  int64_t param_offset(int u) const;       // the unit's params (full) or its chunk (sharded)
  int64_t grad_owned_offset(int u) const;  // the reduced owned chunk of the gradient
  int64_t opt_offset(int u) const;         // start of the optimizer range
  int64_t opt_begin(int u) const;          // optimizer range inside the unit, unit-relative
  int64_t opt_end(int u) const;
  int64_t param_index(int u, int64_t x) const;  // unit element x in the param array
  int64_t opt_index(int u, int64_t x) const { return opt_offset(u) + (x - opt_begin(u)); }
  int64_t opt_stop(int u) const { return opt_index(u, opt_end(u)); }  // end of u's optimizer range
  // Where each unit begins in the optimizer's arrays (else the param array): their NVMe segments.
  std::vector<int64_t> unit_starts(bool optimizer) const;

  StateArray& param() { return param_; }
  const StateArray& param() const { return param_; }
  StateArray& master() { return cfg_.mixed_precision() ? master_ : param_; }
  const StateArray& master() const { return cfg_.mixed_precision() ? master_ : param_; }
  StateArray& exp_avg() { return exp_avg_; }
  StateArray& exp_avg_sq() { return exp_avg_sq_; }
  const StateArray& exp_avg() const { return exp_avg_; }
  StateArray& owned_array(OwnedKind k) {
    return k == OwnedKind::kMaster ? master() : k == OwnedKind::kExpAvg ? exp_avg_ : exp_avg_sq_;
  }
  char* grad_ptr(int64_t elem) const { return grad_.as<char>() + elem * gsize_; }
  bool grads_on_host() const { return grads_on_host_; }  // the gradient buffer is pinned host memory
  PinnedPool* pool() const { return pool_.get(); }       // null without NVMe state
  // The optimizer's sub-group (elements) where state is on NVMe; 0 without.
  int64_t group_elems() const { return group_elems_; }
  // What the pinned pool holds per element of a sub-group whose windows take `optimizer_bytes`.
  uint64_t pool_bytes_per_elem(uint64_t optimizer_bytes) const;
  NvmeStore::Traffic nvme_traffic() const;  // summed over the stores
  void wait_nvme_idle();                     // every store's submitted transfers complete

  // Elements [e, e+n) of `a` (stored as `dt`) to or from host fp32, through pinned windows for
  // NVMe parts.
  Status get_f32(const StateArray& a, DType dt, int64_t e, int64_t n, float* dst);
  Status put_f32(StateArray& a, DType dt, int64_t e, int64_t n, const float* src);
  std::unique_ptr<ChunkLoad> chunk_load(int u, const Buffer& dst);  // this rank's chunk of unit u

 private:
  Status open_offload(const std::string& job, int64_t opt_elems, int64_t param_elems);
  StateHome home(const OffloadConfig& o, const char* region) const;

  const EngineOptions& cfg_;
  Device& dev_;
  const ShardLayout& layout_;
  StagePlan plan_;
  int rank_;
  NvmeEnv* env_;
  size_t wsize_;
  DType gdtype_;
  size_t gsize_;
  std::unique_ptr<PinnedPool> pool_;  // declared first: the stores lease from it
  bool pool_registered_ = false;      // pool_ is registered with the device
  // The parameter loads' windows whose uploads may still run (the pool's reclaimer).
  std::unique_ptr<WindowRetirement> retirement_;
  std::vector<std::unique_ptr<NvmeStore>> stores_;
  std::vector<std::string> store_paths_;  // the nvme_path of each store
  int64_t group_elems_ = 0;
  StateArray param_, master_, exp_avg_, exp_avg_sq_;
  Buffer grad_;
  bool grads_on_host_ = false;  // sharded, optimizer offloaded
};

}  // namespace zoe

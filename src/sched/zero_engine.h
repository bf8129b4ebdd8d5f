// ZeroEngine: the one ZeRO pipeline behind the unit API (zoe/engine.h).
//
// Storage per rank (P_pad, S from ShardLayout; w = bytes of the weight dtype):
//   param      : shard_params ? S : P_pad elements of dtype      (home: offload_param)
//   grad       : shard_grads  ? S : P_pad elements of grad dtype (device; pinned host memory
//                when sharded and offload_optimizer is on: the host Adam reads it there)
//   master/m/v : shard_optimizer ? S : P_pad fp32 each           (home: offload_optimizer)
//                (no separate master in fp32 training: the param storage is the master)
// A home is a StateArray: memory on the device, with `ratio` of it on the offload tier (host
// memory, or an NVMe region reached through pinned windows). The optimizer walks its range in
// sub-groups, reading sub-group k+1 from NVMe while Adam runs on k and k-1 is written back.
// One step: grads_ready reduce-scatters each unit's gradient into its owner chunk right away when
// gradients are sharded, else accumulates locally and the reduce-scatter runs in step(); the
// global norm is summed from the owned chunks; unsharded optimizer state all-gathers the reduced
// gradient (RS + AG = all-reduce); Adam steps the optimizer range; replicated parameters are
// all-gathered from their owners; sharded parameters are gathered by the next fetch().
#pragma once
#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "common/config.h"
#include "sched/chunk_load.h"
#include "sched/comm_worker.h"
#include "sched/gather_pool.h"
#include "sched/loss_scaler.h"
#include "sched/optimizer_windows.h"
#include "sched/prefetch_policy.h"
#include "sched/shard_layout.h"
#include "sched/stage_plan.h"
#include "sched/state_array.h"
#include "sched/window_sums.h"
#include "sched/unit_trace.h"
#include "sched/update_progress.h"
#include "cpu/adam.h"
#include "zoe/device.h"
#include "zoe/engine.h"

namespace zoe {

class ZeroEngine final : public Engine {
 public:
  ZeroEngine(const Config& c, Device& d, Comm& comm, std::vector<UnitSpec> units);
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
  Result<StepResult> flush() override;
  void require_matching_grads(bool on) override { require_matching_ = on; }

  void set_activation_bytes(uint64_t bytes) override;
  double loss_scale() const override { return scaler_.scale(); }
  int64_t steps_applied() const override { return steps_applied_; }
  OwnedRange owned_range(int u) const override { return {opt_begin(u), opt_end(u)}; }
  Status read_owned(int u, OwnedKind k, int64_t begin, int64_t end, float* dst) override;
  Status write_owned(int u, OwnedKind k, int64_t begin, int64_t end, const float* src) override;
  // The optimizer's sub-group (elements) and the pinned pool's size; 0 without NVMe state.
  int64_t sub_group_elems() const { return group_elems_; }
  Status commit_owned_state() override;

  // The units' fetch order of the last complete step (stage 3; empty before one).
  const std::vector<int>& unit_order() const { return trace_.plan(); }

  // What stage 3's scheduler did since the engine was made.
  struct SchedStats {
    int64_t loads_ahead = 0;       // chunk loads started ahead of their fetch
    int64_t staged_ahead = 0;      // of those without device room: NVMe reads into pinned memory only
    int64_t copied_ahead = 0;      // NVMe pieces of loads ahead copied to the device as they landed
    int64_t fetched_loading = 0;   // fetches that found their chunk loaded or on its way (or gathered ahead)
    int64_t fetched_kept = 0;      // fetches no rank had to gather for (kept for reuse)
    int64_t evicted = 0;           // kept units dropped to make room
    int64_t deviations = 0;        // steps that left the recorded unit order
    int64_t reductions_async = 0;  // gradient reductions run on the communication thread
    int64_t gathered_ahead = 0;    // all-gathers started one fetch ahead, on that thread
    int64_t adam_hashed_blocks = 0;  // NVMe blocks whose sums the host Adam made (window_sums.h)
    uint64_t nvme_read_bytes = 0;    // what the NVMe stores' devices moved (NvmeStore::traffic)
    uint64_t nvme_written_bytes = 0;
    uint64_t nvme_hashed_bytes = 0;  // block sums the NVMe I/O threads made or checked (not Adam's)
    uint64_t nvme_forwarded_bytes = 0;  // reads served from pending writes' memory (not the device)
  };
  SchedStats sched_stats() const;
  void restore_counters(int64_t steps, double scale, int64_t good, int hyst) override;
  void scaler_state(int64_t* good, int* hyst) const override;

 private:
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
  char* grad_ptr(int64_t elem) const { return grad_.as<char>() + elem * gsize_; }
  StateArray& master() { return cfg_.mixed_precision() ? master_ : param_; }
  StateArray& owned_array(OwnedKind k) {
    return k == OwnedKind::kMaster ? master() : k == OwnedKind::kExpAvg ? exp_avg_ : exp_avg_sq_;
  }

  struct OwnedPlace {
    StateArray* array;
    DType dtype;
    int64_t index;  // of element `begin`
  };
  Result<OwnedPlace> owned_place(const char* op, int u, OwnedKind k, int64_t begin, int64_t end);
  // The NVMe stores and the pinned pool, when a home is on NVMe.
  Status open_offload(int64_t opt_elems, int64_t param_elems);
  uint64_t pool_bytes_per_elem(uint64_t optimizer_bytes) const;
  // Elements [e, e+n) of `a` (stored as `dt`) to or from host fp32, through pinned windows for
  // NVMe parts.
  Status get_f32(const StateArray& a, DType dt, int64_t e, int64_t n, float* dst);
  Status put_f32(StateArray& a, DType dt, int64_t e, int64_t n, const float* src);
  std::unique_ptr<ChunkLoad> chunk_load(int u, const Buffer& dst);  // this rank's chunk of unit u

  // Stage 3's scheduler (src/sched: UnitTrace, PrefetchPolicy, ChunkLoad, GatherPool). Every
  // collective follows an agreement; what runs ahead is this rank's own chunk on its way from its
  // home tier and, agreed one fetch early, the next unit's gather on the communication thread;
  // what stays is a gathered unit fetched again soon.
  Status check_device_fits();               // start-up: the largest unit fits next to the state
  Status start_comm_worker();               // start-up: comm_worker_ where overlap_comm can run
  uint64_t unit_device_need(int u) const;   // device bytes of one unit in flight
  uint64_t device_free(const LedgerSnapshot& l) const;  // the budget less what l has on the device
  bool has_room(uint64_t bytes);            // may the scheduler hold `bytes` more
  Result<Buffer> gather_buffer(int u);      // from the pool; evicts kept units when full
  void prefetch_ahead();                    // starts the loads the policy asks for
  void advance_loads();                     // loads ahead copy what has landed
  // Drops a kept or loading unit (refs must be 0); the error of a gather ahead that failed, which
  // no fetch will see now.
  Status unload(int u);
  Status unload_all();                      // before the parameters change; the first error

  // Every collective the engine starts is preceded by an agreement on what it is (control
  // traffic), so ranks whose models call the unit API differently never mismatch collectives:
  // gradients one rank hands over are reduced with zeros from ranks that have none for that
  // unit; any other disagreement is an error on every rank, never a hang.
  enum class OpKind : int32_t { kFetch = 1, kGrads = 2, kStep = 3 };
  // A fetch's agreement also settles whether the unit the plan fetches next is gathered now, on
  // the communication thread (every rank can, and some rank needs it).
  struct AheadGather {
    int v = -1;          // the plan's next unit, or -1
    bool ready = false;  // this rank's chunk of v is loaded or loading with every read issued
    bool needs = false;  // v is not gathered here
    bool go = false;     // out: every rank starts v's gather now
  };
  AheadGather ahead_candidate(int u) const;
  void start_gather_ahead(int v);
  Status wait_gathered(int u);  // a gather started ahead of u's fetch has landed
  // need (fetch only): in, this rank has to gather; out, some rank has to (then all do).
  Status sync_point(OpKind kind, int u, const float* grad, bool* need = nullptr, AheadGather* ahead = nullptr);
  Result<StepResult> apply_step(double lr);
  // The optimizer's pass runs on update_thread_ (UpdateProgress says how far it is).
  void start_update(double lr, double grad_scale);
  Status wait_update();                    // the whole pass (joins its thread)
  Status wait_updated(int u);              // unit u's part of it
  Status reduce_sharded_grad(int u, const float* grad);  // grad null: contribute zeros
  CommWorker::Job reduction_job(int u, const Buffer& buf, bool first);
  // Gradient reductions in flight on comm_worker_ (stages 2-3 with overlap_comm): waits for the
  // oldest until at most `units` of them and `elems` elements are left; frees their buffers.
  Status reap_reductions(size_t units, int64_t elems);
  Status finish_reductions() { return reap_reductions(0, -1); }
  Result<Buffer> after_reductions_if_full(const std::function<Result<Buffer>()>& alloc);
  Status reduce_unit_grad(int u, const void* full_grad);  // RS into the owned chunk
  Result<double> owned_grad_sumsq(double* handed);
  Status check_matching_grads();
  void drop_step_grads();
  Status apply_adam(double lr, double grad_scale);
  struct AdamTask;
  struct GroupRange {
    AdamRange r;
    int64_t e = 0;                        // optimizer index of the range's first element
    int64_t master_at = 0, param_at = 0;  // array indices of the range's master and weight copy
  };
  std::vector<GroupRange> group_ranges(const std::vector<AdamTask>& tasks, int64_t a, int64_t b,
                                       const std::array<char*, 4>& win);
  Status run_adam_group(const std::vector<AdamTask>& tasks, int64_t a, int64_t b, const std::array<char*, 4>& win,
                        AdamHyper h);
  // Pinned host memory for a host-stepped sub-group's device-memory parts, per element: its
  // gradients, its fp32 weights (fp32 training) and its low-precision weight copy; only what
  // some array keeps in device memory (nothing when all of it is host memory or NVMe windows).
  struct HostStaging {
    Device* dev = nullptr;
    Buffer buf;
    size_t grad_bytes = 0, master_bytes = 0, weight_bytes = 0;
    Status prepare(ZeroEngine& e, const std::vector<std::pair<int64_t, int64_t>>& groups);
    char* grads() const { return buf.as<char>(); }
    char* masters(int64_t n) const { return grads() + n * grad_bytes; }
    char* weights(int64_t n) const { return masters(n) + n * master_bytes; }
    ~HostStaging();
  };
  // hashed: the windowed arrays whose block sums this step makes (see window_sums.h); may be null.
  Status run_host_adam_group(const std::vector<AdamTask>& tasks, int64_t a, int64_t b,
                             const std::array<char*, 4>& win, AdamHyper h, const HostStaging& staging,
                             const std::vector<HashedArray>* hashed);
  // Whether sub-group [a, b) is stepped by the CPU Adam on the host (its state is not device memory).
  bool host_adam(int64_t a) const { return !exp_avg_.in_device_memory(a); }
  Status gather_replicated_params();
  using GroupStep = OptimizerWindows::Step;
  std::vector<AdamTask> adam_tasks();
  // The arrays the optimizer streams through pinned windows (those with an NVMe part).
  WindowLayout window_layout();
  SubGroups adam_groups(const std::vector<AdamTask>& tasks, bool streaming);
  void drop_read_ahead() {  // before anything rewrites the state
    if (windows_) windows_->drop_read_ahead();
  }

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
  std::unique_ptr<PinnedPool> pool_;                // declared first: the stores lease from it
  std::vector<std::unique_ptr<NvmeStore>> stores_;
  std::vector<std::string> store_paths_;            // the nvme_path of each store
  int64_t group_elems_ = 0;
  StateArray param_, master_, exp_avg_, exp_avg_sq_;
  std::unique_ptr<OptimizerWindows> windows_;  // after the arrays and the pool: it holds their tickets and leases
  Buffer grad_;
  bool grads_on_host_ = false;  // grad_ is pinned host memory (sharded, optimizer offloaded)
  // Device-side results of a step, read back once: the squared gradient norm and the count of
  // non-finite gradient elements Adam met.
  struct StepScalars {
    double sumsq;
    uint64_t nonfinite;
  };
  Buffer scalars_;
  struct Gathered {
    Buffer buf;
    int refs = 0;
    std::unique_ptr<ChunkLoad> load;  // while residency_ says kLoading, or the gather ahead runs
    uint64_t gathering = 0;           // comm_worker_'s ticket of the gather started ahead
  };
  GatherPool gather_pool_;  // before gathered_: gathered buffers go back to it
  std::vector<Gathered> gathered_;
  std::vector<Residency> residency_;  // per unit; what PrefetchPolicy reads
  UnitTrace trace_;
  PrefetchPolicy prefetch_;
  bool told_deviation_ = false;
  SchedStats stats_;
  UpdateProgress progress_;
  std::thread update_thread_;
  // The communication thread (its own duplicate of comm_) and the reductions queued on it.
  std::unique_ptr<CommWorker> comm_worker_;
  struct Reduction {
    uint64_t ticket;
    Buffer buf;     // the unit's gradient in the gradient dtype, N chunks
    int64_t elems;
  };
  std::deque<Reduction> reducing_;
  int64_t reducing_elems_ = 0;
  StepResult pending_;      // the last step's result, completed by flush()
  bool pending_open_ = false;
  uint64_t activation_peak_ = 0;  // the model's device activations, the most seen at a fetch
  uint64_t reserve_ = 0;  // the largest unit_device_need: what keeping and prefetching leave free
  std::vector<int> local_seen_;    // replicated grads: micro-steps that accumulated unit u locally
  std::vector<int> reduced_;       // sharded grads: reductions into unit u's owned chunk this step
  std::vector<int> handed_here_;   // grads_ready calls this rank made for unit u this step
  bool require_matching_ = false;
  int64_t steps_applied_ = 0;
  uint64_t host_nonfinite_ = 0;  // non-finite gradients the host-stepped sub-groups met this step
  int64_t host_stepped_ = 0;     // elements they stepped
  uint64_t activation_bytes_ = 0;
};

}  // namespace zoe

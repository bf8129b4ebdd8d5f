// OptimizerPass: one step's fused Adam over this rank's optimizer range, walked in sub-groups on
// a worker thread of its own. Sub-groups never cross a part boundary of any array nor a unit's
// end: memory parts are stepped in place by the device's kernel, host-memory and NVMe parts by
// the CPU Adam (ZeRO-Offload), NVMe parts through pinned windows that OptimizerWindows reads
// ahead and writes back. The pass says how far it is (UpdateProgress) after each sub-group, so a
// stage-3 fetch waits only for its own unit's part.
//
// A pass begun in the backward (zoe.update_in_backward) walks the units in reverse, the backward's
// order, and steps each unit only once its gate (UnitGates) says its gradient is final; its reads
// run ahead of the gates. Adam is elementwise and needs nothing global but the gradient's scale,
// which such a pass assumes (unclipped, finite); where the step confirms it the result is bitwise
// the pass after the backward, else the engine takes it back (AdamHyper::undo) in the next pass.
//
// Threads: the caller (the engine) calls every method; the worker runs the pass and touches only
// the RankState arrays of the optimizer range, the windows and the pass's own counters. The two
// meet through UpdateProgress (how far; the pass's Status) and the worker's mutex (start, stop).
// The caller reads the counters (counts()) and resets them only while no pass runs.
#pragma once
#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/adam.h"
#include "sched/optimizer/optimizer_windows.h"
#include "sched/rank_state.h"
#include "sched/optimizer/unit_gates.h"
#include "sched/optimizer/update_progress.h"
#include "sched/optimizer/window_sums.h"
#include "zoe/device.h"

namespace zoe {

class OptimizerPass {
 public:
  OptimizerPass(RankState& state, Device& dev);
  ~OptimizerPass();  // waits for a pass in flight; reports an error no wait returned on stderr
  OptimizerPass(const OptimizerPass&) = delete;
  OptimizerPass& operator=(const OptimizerPass&) = delete;

  // After the state is allocated: the device counter, and the windows where state is on NVMe.
  Status allocate();

  // Starts the pass with hyperparameters h (h.step: the step being applied) on the worker.
  void start(const AdamHyper& h);
  // Starts a pass in the backward: units in reverse order, each after open(u) (or open_all());
  // cancel() ends it unfinished (a step that is not applied; the units already stepped stay so).
  void start_in_backward(const AdamHyper& h);
  void open(int u) {
    if (!awaiting_step_ || gates_.is_open(u)) return;
    ready_[u] = dev_.record(Stream::kCompute);  // (before the gate: the worker reads it after)
    gates_.open(u);
    ++opened_in_backward_;
    ++opened_this_pass_;
  }
  // Units whose gates open() opened, in all passes so far: stepped beside the backward.
  int64_t opened_in_backward() const { return opened_in_backward_; }
  // ... in the pass begun last (0: a pass begun in the backward has stepped nothing yet).
  int64_t opened_this_pass() const { return opened_this_pass_; }
  void open_all() {
    awaiting_step_ = false;
    const Event now = dev_.record(Stream::kCompute);
    for (size_t u = 0; u < ready_.size(); ++u)
      if (!gates_.is_open(static_cast<int>(u))) ready_[u] = now;
    gates_.open_all();
  }
  void cancel();  // waits for the pass to end
  // Before start_in_backward, while the pool has no other holder the pass could wait for: the
  // pass's rotating NVMe windows (OptimizerWindows::reserve).
  Status reserve_windows();
  // A pass begun in the backward waits for its step (open_all or cancel).
  bool in_backward() const { return awaiting_step_; }
  bool gate_open(int u) const { return gates_.is_open(u); }

  Status wait();  // the whole pass
  // Unit u's weights and gradient are free for the next use: its update is done (or, in a pass
  // begun in the backward, not yet begun: its gate is closed).
  Status wait_for_unit(int u);
  bool updated(int u) const;
  bool running() const { return progress_.running(); }

  // Non-finite gradient elements the last pass met and elements the CPU Adam stepped: read after
  // wait(), reset before the next start().
  struct Counts {
    uint64_t nonfinite = 0;
    int64_t host_stepped = 0;
  };
  Result<Counts> counts();
  Status reset_counts();

  void drop_read_ahead() {  // before anything rewrites the state
    if (windows_) windows_->drop_read_ahead();
  }
  int64_t hashed_blocks() const { return windows_ ? windows_->hashed_blocks() : 0; }

 private:
  struct Task;  // one tensor segment of the optimizer range
  struct GroupRange {
    AdamRange r;
    int64_t e = 0;                        // optimizer index of the range's first element
    int64_t master_at = 0, param_at = 0;  // array indices of the range's master and weight copy
  };
  class HostStaging;

  // What a pass walks, computed once per order on the caller's thread (optimizer_pass.cc).
  struct Plan;
  const Plan& plan(bool reverse);
  void begin(const AdamHyper& h, bool in_backward);

  void run_worker();
  Status run(const AdamHyper& h, const Plan& p, bool gated);
  std::vector<Task> tasks() const;
  WindowLayout window_layout();
  SubGroups groups(const std::vector<Task>& tasks, bool streaming, std::vector<int>* units);  // and each one's unit
  std::vector<GroupRange> group_ranges(const std::vector<Task>& tasks, int64_t a, int64_t b,
                                       const std::array<char*, 4>& win);
  Status run_device_group(const std::vector<Task>& tasks, int64_t a, int64_t b, const std::array<char*, 4>& win,
                          const AdamHyper& h);
  // hashed: the windowed arrays whose block sums this step makes (see window_sums.h); may be null.
  // ready: the compute stream's event after which the group's gradients are final and its old
  // weights read for the last time (ready_ of its unit).
  Status run_host_group(const std::vector<Task>& tasks, int64_t a, int64_t b, const std::array<char*, 4>& win,
                        const AdamHyper& h, const HostStaging& staging, const std::vector<HashedArray>* hashed,
                        Event ready);
  // Whether sub-group [a, b) is stepped by the CPU Adam on the host (its state is not device memory).
  bool host_stepped(int64_t a) const { return !s_.exp_avg().in_device_memory(a); }
  // A pass begun in the backward has not begun on unit u (its gate is closed).
  bool not_begun(int u) const { return in_backward_ && !gates_.is_open(u); }

  RankState& s_;
  Device& dev_;
  std::unique_ptr<OptimizerWindows> windows_;  // with state on NVMe
  Buffer nonfinite_;                           // device counter the device kernel adds to
  uint64_t host_nonfinite_ = 0;                // the CPU Adam's count (worker only while running)
  int64_t host_stepped_ = 0;
  UpdateProgress progress_;
  std::unique_ptr<Plan> plans_[2];  // ascending, descending
  const Plan* current_ = nullptr;   // the last started pass's (caller's thread)
  bool in_backward_ = false;        // the last started pass is gated (caller's thread)
  bool awaiting_step_ = false;      // ... and some gates may still be closed
  bool cancelled_ = false;
  int64_t opened_in_backward_ = 0;
  int64_t opened_this_pass_ = 0;
  UnitGates gates_;
  // Per unit, the compute stream's event after which its gradient is final and its old weights
  // were last read: recorded at start() for a pass after the backward, at open(u) (or
  // open_all()) for one begun in it. The CPU Adam's copies wait for it, not for every kernel
  // queued since (the next forward's, which would make Adam and the forward take turns).
  std::vector<Event> ready_;
  // The worker: waits for a pass to start, runs it, reports through progress_.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool queued_ = false;
  AdamHyper next_{};
  const Plan* next_plan_ = nullptr;
  bool next_gated_ = false;
  std::thread worker_;
};

}  // namespace zoe

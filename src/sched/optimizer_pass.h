// OptimizerPass: one step's fused Adam over this rank's optimizer range, walked in sub-groups on
// a worker thread of its own. Sub-groups never cross a part boundary of any array nor a unit's
// end: memory parts are stepped in place by the device's kernel, host-memory and NVMe parts by
// the CPU Adam (ZeRO-Offload), NVMe parts through pinned windows that OptimizerWindows reads
// ahead and writes back. The pass says how far it is (UpdateProgress) after each sub-group, so a
// stage-3 fetch waits only for its own unit's part.
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
#include "sched/optimizer_windows.h"
#include "sched/rank_state.h"
#include "sched/update_progress.h"
#include "sched/window_sums.h"
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
  Status wait();                       // the whole pass
  Status wait_until(int64_t opt_index);  // optimizer indices below opt_index are updated
  Status wait_for_unit(int u);           // unit u's optimizer range is updated
  bool updated(int64_t opt_index) const { return progress_.updated(opt_index); }
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

  void run_worker();
  Status run(const AdamHyper& h);
  std::vector<Task> tasks() const;
  WindowLayout window_layout();
  SubGroups groups(const std::vector<Task>& tasks, bool streaming);
  std::vector<GroupRange> group_ranges(const std::vector<Task>& tasks, int64_t a, int64_t b,
                                       const std::array<char*, 4>& win);
  Status run_device_group(const std::vector<Task>& tasks, int64_t a, int64_t b, const std::array<char*, 4>& win,
                          const AdamHyper& h);
  // hashed: the windowed arrays whose block sums this step makes (see window_sums.h); may be null.
  Status run_host_group(const std::vector<Task>& tasks, int64_t a, int64_t b, const std::array<char*, 4>& win,
                        const AdamHyper& h, const HostStaging& staging, const std::vector<HashedArray>* hashed);
  // Whether sub-group [a, b) is stepped by the CPU Adam on the host (its state is not device memory).
  bool host_stepped(int64_t a) const { return !s_.exp_avg().in_device_memory(a); }

  RankState& s_;
  Device& dev_;
  std::unique_ptr<OptimizerWindows> windows_;  // with state on NVMe
  Buffer nonfinite_;                           // device counter the device kernel adds to
  uint64_t host_nonfinite_ = 0;                // the CPU Adam's count (worker only while running)
  int64_t host_stepped_ = 0;
  UpdateProgress progress_;
  // The worker: waits for a pass to start, runs it, reports through progress_.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool queued_ = false;
  AdamHyper next_{};
  std::thread worker_;
};

}  // namespace zoe

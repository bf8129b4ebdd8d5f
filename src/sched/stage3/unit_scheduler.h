// UnitScheduler: stage 3's gathered units on this rank. It owns where each unit is (Residency),
// the device buffers they use (a GatherPool), the trace of fetches the plan comes from, and the
// device room that keeping and loading ahead may use; it asks PrefetchPolicy for every decision
// (what to load ahead and where, what to keep, what to evict, which gather runs ahead) and moves
// nothing itself: loads, gathers and the ranks' agreement go through a UnitMover. So the
// virtual-clock tests (prefetch_policy_test.cc) drive this very state machine with fakes.
//
// A fetch: the ranks agree (every rank gathers when any must: their residency may differ, a full
// device evicts), a gather started ahead is waited for, else this rank's chunk comes from its
// home tier (already on its way when it was loaded ahead) and is all-gathered. Then what the
// policy asks for starts loading ahead. A release keeps the unit or gives its buffer back.
//
// Room: the device budget less what the ledger holds, plus idle gather buffers (reusable), less
// the reserve (a unit in flight, a reduction buffer) and the model's activations as high as they
// have been at a fetch: the budget is a hard limit for the model's allocations too, and they
// cannot evict.
//
// Threads: the caller's only (a gather ahead runs on the mover's communication thread, and is
// waited for here before its unit is touched).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "sched/stage3/gather_pool.h"
#include "sched/stage3/prefetch_policy.h"
#include "sched/stage3/unit_mover.h"
#include "sched/stage3/unit_trace.h"
#include "zoe/device.h"

namespace zoe {

class UnitScheduler {
 public:
  struct Stats {
    int64_t loads_ahead = 0;      // chunk loads started ahead of their fetch
    int64_t staged_ahead = 0;     // of those without device room: NVMe reads into pinned memory only
    int64_t fetched_loading = 0;  // fetches that found their chunk loaded or on its way (or gathered ahead)
    int64_t fetched_kept = 0;     // fetches no rank had to gather for (kept for reuse)
    int64_t evicted = 0;          // kept or loading units dropped to make room
    int64_t deviations = 0;       // steps that left the recorded unit order
    int64_t gathered_ahead = 0;   // all-gathers started one fetch ahead, on the communication thread
  };
  struct Fetched {
    void* data;      // the gathered unit, in the weight dtype
    bool left_plan;  // this fetch left the recorded order (prefetching stops for the step)
  };

  // unit_elems: each unit's gathered elements; wsize: bytes per element; budget: the device's.
  UnitScheduler(Device& dev, UnitMover& mover, std::vector<int64_t> unit_elems, size_t wsize, PrefetchLimits limits,
                uint64_t budget, bool poison_released);
  ~UnitScheduler() { clear(); }
  UnitScheduler(const UnitScheduler&) = delete;
  UnitScheduler& operator=(const UnitScheduler&) = delete;

  // Start-up: what keeping and loading ahead leave free; the budget less what the device holds.
  void set_reserve(uint64_t bytes) { reserve_ = bytes; }
  uint64_t reserve() const { return reserve_; }
  uint64_t device_free() const;

  Result<Fetched> fetch(int u);
  bool fetched(int u) const { return units_[u].refs > 0; }
  Status release(int u);  // u must be fetched
  void begin_step() { trace_.begin_step(); }  // the last step's order becomes the plan
  void prefetch();         // starts the loads the policy asks for; failures are left to the fetch
  Status unload_all();     // before the parameters change: every unit not fetched goes; the first error
  Status drop_idle();      // a full device: idle buffers and units not fetched go
  void clear();            // waits for everything in flight and frees every buffer

  const std::vector<int>& plan() const { return trace_.plan(); }
  Residency residency(int u) const { return residency_[u]; }
  Stats stats() const;

 private:
  struct Unit {
    Buffer buf;
    int refs = 0;
    std::unique_ptr<UnitLoad> load;  // while kLoading or kStaged, or while the gather ahead runs
    uint64_t gathering = 0;          // the mover's ticket of the gather started ahead
  };
  size_t bytes(int u) const { return static_cast<size_t>(elems_[u]) * wsize_; }
  uint64_t free_in(const LedgerSnapshot& l) const;  // the budget less what l has on the device
  void keep_reserve_free();             // idle gather buffers go when the reserve is not free
  int64_t room();                      // gathered elements the device can take (may be negative)
  Status gather(int u);                // this rank's chunk from its tier, then the all-gather
  Result<Buffer> gather_buffer(int u);  // from the pool; evicts what the policy says when full
  Status unload(int u);                // refs must be 0; the error of a gather ahead no fetch will see
  AheadGather ahead_candidate(int u) const;
  void start_gather_ahead(int v);
  Status wait_gathered(int u);

  Device& dev_;
  UnitMover& mover_;
  std::vector<int64_t> elems_;
  size_t wsize_;
  uint64_t budget_;
  GatherPool pool_;  // before units_: their buffers go back to it
  PrefetchPolicy policy_;
  std::vector<Unit> units_;
  std::vector<Residency> residency_;  // per unit; what the policy reads
  UnitTrace trace_;
  Stats stats_;
  uint64_t reserve_ = 0;
  uint64_t activation_peak_ = 0;  // the model's device activations, the most seen
};

}  // namespace zoe

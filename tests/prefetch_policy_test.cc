// Stage 3's scheduler on fakes. UnitTrace and PrefetchPolicy are pure; UnitScheduler, the state
// machine that asks the policy, is driven here on a virtual clock through plan/virtual_mover.h
// (loads on one virtual I/O worker, gathers and the agreement of one rank), with the CPU device's budgeted
// arena as its device memory: the overlap prefetching buys, eviction order, staged reads and a
// quarter-budget step are checked without a store, a communicator or a thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "cpu/cpu_device.h"
#include "plan/virtual_mover.h"
#include "sched/stage3/prefetch_policy.h"
#include "sched/stage3/unit_scheduler.h"
#include "sched/stage3/unit_trace.h"

namespace zoe {
namespace {

using R = Residency;

TEST(UnitTrace, RecordsTheFirstStepAndFollowsItAfter) {
  UnitTrace t;
  t.begin_step();
  EXPECT_FALSE(t.following());  // nothing recorded yet
  for (int u : {0, 1, 2, 1, 0}) t.observe(u);
  t.begin_step();
  EXPECT_EQ(t.plan(), (std::vector<int>{0, 1, 2, 1, 0}));
  EXPECT_TRUE(t.following());
  for (int u : {0, 1, 2}) EXPECT_TRUE(t.observe(u));
  EXPECT_EQ(t.next(), 3u);
  EXPECT_EQ(t.deviations(), 0);
}

TEST(UnitTrace, AnotherOrderOrAnEarlyStopIsADeviationAndTheNewPlan) {
  UnitTrace t;
  t.begin_step();
  for (int u : {0, 1, 2}) t.observe(u);
  t.begin_step();
  EXPECT_TRUE(t.observe(0));
  EXPECT_FALSE(t.observe(2));
  EXPECT_FALSE(t.following());
  EXPECT_FALSE(t.observe(1));  // stays off for the rest of the step
  EXPECT_EQ(t.deviations(), 1);
  t.begin_step();
  EXPECT_EQ(t.plan(), (std::vector<int>{0, 2, 1}));
  EXPECT_TRUE(t.observe(0));   // stops early: counted when the step ends
  t.begin_step();
  EXPECT_EQ(t.deviations(), 2);
  EXPECT_EQ(t.plan(), (std::vector<int>{0}));
}

PrefetchLimits limits(int64_t bucket, int64_t live, int64_t reuse) { return {bucket, live, reuse}; }

constexpr int64_t kRoom = 1 << 30;  // the device has room for anything

std::vector<AheadLoad> on_device(std::vector<int> us) {
  std::vector<AheadLoad> v;
  for (int u : us) v.push_back({u, false});
  return v;
}

TEST(PrefetchPolicy, LoadsAheadInPlanOrderWithinTheBucket) {
  PrefetchPolicy p({10, 10, 10, 10, 10}, limits(25, 1000, 0));
  std::vector<int> plan = {0, 1, 2, 3, 4};
  std::vector<R> st(5, R::kAbsent);
  st[0] = R::kGathered;  // in use
  EXPECT_EQ(p.ahead(plan, 1, st, kRoom), on_device({1, 2, 3}));  // 3 starts at 20 < 25; 4 would at 30
  st[1] = R::kLoading;
  EXPECT_EQ(p.ahead(plan, 1, st, kRoom), on_device({2, 3}));     // 1 is in flight and counts
  st[2] = R::kGathered;                                           // kept: costs nothing ahead
  EXPECT_EQ(p.ahead(plan, 1, st, kRoom), on_device({3, 4}));
  EXPECT_TRUE(PrefetchPolicy({10}, limits(0, 1000, 0)).ahead({0}, 0, {R::kAbsent}, kRoom).empty());  // off
}

TEST(PrefetchPolicy, StopsAtTheFirstUnitThatDoesNotFitAndCountsRepeatsOnce) {
  PrefetchPolicy p({10, 50, 10, 10}, limits(100, 1000, 0));
  std::vector<R> st(4, R::kAbsent);
  EXPECT_EQ(p.ahead({0, 0, 2, 2, 3}, 0, st, kRoom), on_device({0, 2, 3}));
  PrefetchPolicy small({10, 50, 10, 10}, limits(40, 1000, 0));
  // 1 starts with 10 on their way and crosses the bucket; 2 does not start: order is the point.
  EXPECT_EQ(small.ahead({0, 1, 2}, 0, st, kRoom), on_device({0, 1}));
  // A unit larger than the whole bucket is still loaded one ahead (DeepSpeed's rule), never two.
  EXPECT_EQ(small.ahead({1, 0}, 0, st, kRoom), on_device({1}));
  std::vector<R> loading = st;
  loading[1] = R::kLoading;  // on its way already: counted, so nothing after it starts
  EXPECT_EQ(small.ahead({1, 0}, 0, loading, kRoom), on_device({}));
  PrefetchPolicy live({10, 50, 10, 10}, limits(100, 25, 0));
  st[3] = R::kGathered;  // 10 live
  EXPECT_EQ(live.ahead({0, 2}, 0, st, kRoom), on_device({0}));     // 10 + 10 + 10 > 25
}

TEST(PrefetchPolicy, WhatTheDeviceHasNoRoomForIsStaged) {
  PrefetchPolicy p({10, 30, 10, 10}, limits(100, 1000, 0));
  std::vector<R> st(4, R::kAbsent);
  EXPECT_EQ(p.ahead({0, 1, 2, 3}, 0, st, 25),
            (std::vector<AheadLoad>{{0, false}, {1, true}, {2, false}, {3, true}}));  // 10 + 10 fit in 25
  EXPECT_EQ(p.ahead({0, 1}, 0, st, -1), (std::vector<AheadLoad>{{0, true}, {1, true}}));
}

TEST(PrefetchPolicy, KeepsWhatIsFetchedAgainWithinTheReuseDistance) {
  PrefetchPolicy p({10, 10, 10, 10}, limits(0, 1000, 20));
  std::vector<int> plan = {0, 1, 2, 3, 3, 2, 1, 0};
  std::vector<R> st(4, R::kGathered);
  EXPECT_TRUE(p.keep(plan, 4, 3, st, kRoom));   // next fetch is 3 itself: distance 0
  EXPECT_TRUE(p.keep(plan, 4, 1, st, kRoom));   // 3, 2 between: 20
  EXPECT_FALSE(p.keep(plan, 4, 0, st, kRoom));  // 30 between
  EXPECT_FALSE(p.keep(plan, 8, 0, st, kRoom));  // not fetched again this step
  EXPECT_TRUE(p.keep(plan, 4, 3, st, 0));       // no room to spare, none missing
  EXPECT_FALSE(p.keep(plan, 4, 3, st, -1));     // less than the device must leave free
  EXPECT_FALSE(PrefetchPolicy({10, 10, 10, 10}, limits(0, 1000, 0)).keep(plan, 4, 3, st, kRoom));
  EXPECT_FALSE(PrefetchPolicy({10, 10, 10, 10}, limits(0, 35, 20)).keep(plan, 4, 3, st, kRoom));  // 40 live
}

TEST(PrefetchPolicy, EvictsWhatThePlanFetchesLastAndWhatItNeverFetchesFirst) {
  PrefetchPolicy p({10, 10, 10, 10, 10}, limits(0, 1000, 0));
  std::vector<int> plan = {0, 1, 2, 3, 0, 1, 2, 3};
  EXPECT_EQ(p.evict_order(plan, 4, {0, 1, 2}), (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(p.evict_order(plan, 6, {0, 4, 2, 3}), (std::vector<int>{0, 4, 3, 2}));  // 0, 4: never; by index
  EXPECT_EQ(p.evict_order({}, 0, {3, 1}), (std::vector<int>{1, 3}));               // no plan: by index
}

TEST(PrefetchPolicy, GathersAheadThePlansNextUnitUnlessItIsTheOneFetched) {
  PrefetchPolicy p({10, 10, 10}, limits(0, 1000, 0));
  EXPECT_EQ(p.gather_ahead({0, 1, 2}, 1, 0), 1);
  EXPECT_EQ(p.gather_ahead({0, 0, 2}, 1, 0), -1);
  EXPECT_EQ(p.gather_ahead({0, 1, 2}, 3, 2), -1);
}

// Units of `elems` bf16 elements each on a CPU device of `budget` bytes, driven as the engine
// does: fetch, compute (`compute` time, and `act` activation bytes on the device held until the
// step's end), release; between steps, unload what is left, begin the step, prefetch.
struct VirtualRun {
  VirtualRun(int units, int64_t elems, PrefetchLimits l, uint64_t budget, double compute, double load)
      : dev(budget, 1 << 20),
        mover(clock, std::vector<double>(units, load), std::vector<bool>(units, false), /*mark=*/true),
        sched(dev, mover, std::vector<int64_t>(units, elems), 2, l, budget, false),
        compute(compute) {
    sched.set_reserve(elems * 2);  // a unit in flight, as the engine reserves
  }
  // One step along `plan`; returns its time. Every fetch must see its own unit's chunk;
  // `after_release(u)` runs after each release.
  double step(const std::vector<int>& plan, size_t act = 0, const std::function<void(int)>& after_release = {}) {
    clock = VirtualClock{};
    EXPECT_TRUE(sched.unload_all().ok());
    sched.begin_step();
    sched.prefetch();
    std::vector<Buffer> acts;
    for (int u : plan) {
      auto f = sched.fetch(u);
      EXPECT_TRUE(f.ok()) << f.status().message();
      if (!f.ok()) return -1;
      int32_t mark;
      std::memcpy(&mark, f->data, sizeof(mark));
      EXPECT_EQ(mark, u) << "unit " << u << " got another unit's chunk";
      if (act) {
        auto a = dev.alloc(act, Tier::kDevice, Kind::kActivation);
        EXPECT_TRUE(a.ok()) << "the model's activation found the device full: " << a.status().message();
        if (a.ok()) acts.push_back(*a);
      }
      clock.now += compute;
      EXPECT_TRUE(sched.release(u).ok());
      if (after_release) after_release(u);
    }
    for (Buffer& b : acts) dev.free(b);
    return clock.now;
  }
  VirtualClock clock;
  CpuDevice dev;
  VirtualMover mover;
  UnitScheduler sched;
  double compute;
};

// The second step of `plan` (the first records it) on a device with room for anything.
double simulate(PrefetchLimits l, const std::vector<int>& plan, double compute, double load) {
  int n = *std::max_element(plan.begin(), plan.end()) + 1;
  VirtualRun run(n, 128, l, 1 << 20, compute, load);
  run.step(plan);
  return run.step(plan);
}

TEST(UnitScheduler, OnAVirtualClockPrefetchHidesTheLoads) {
  std::vector<int> plan;
  for (int u = 0; u < 8; ++u) plan.push_back(u);
  EXPECT_DOUBLE_EQ(simulate(limits(0, 1 << 30, 0), plan, 1.0, 1.0), 16.0);    // load, compute, load...
  EXPECT_DOUBLE_EQ(simulate(limits(256, 1 << 30, 0), plan, 1.0, 1.0), 9.0);   // the first load, then hidden
  // I/O-bound (loads twice compute): the step takes the loads' time plus the last compute.
  EXPECT_DOUBLE_EQ(simulate(limits(256, 1 << 30, 0), plan, 1.0, 2.0), 17.0);
  // Reuse: forward then backward; kept units are not loaded again.
  std::vector<int> fb = plan;
  fb.insert(fb.end(), plan.rbegin(), plan.rend());
  EXPECT_DOUBLE_EQ(simulate(limits(256, 1 << 30, 1 << 30), fb, 1.0, 1.0), 17.0);  // 16 computes, the first load
}

TEST(UnitScheduler, AFullDeviceEvictsTheUnitThePlanFetchesLast) {
  // Room for three gather buffers (and the reserve, which a fetch may use): keeping fills it,
  // and fetching 3 must drop one of 0, 1, 2. 2 is fetched again last: it goes, not 0.
  std::vector<int> plan = {0, 1, 2, 3, 0, 1, 2};
  VirtualRun run(4, 1024, limits(0, 1 << 30, 1 << 30), 3 * 2048, 1.0, 1.0);
  run.sched.set_reserve(0);
  run.step(plan);
  run.mover.loads.clear();
  run.step(plan);
  EXPECT_EQ(run.mover.loads, (std::vector<int>{0, 1, 2, 3, 2}));  // in unit order: 0 would go, then load again
  EXPECT_EQ(run.sched.stats().evicted, 1);
  EXPECT_EQ(run.sched.stats().fetched_kept, 2);  // 0 and 1
}

TEST(UnitScheduler, ChunksTheDeviceHasNoRoomForAreReadAheadIntoPinnedMemory) {
  // Room for one unit ahead beside the reserve: 0 loads into a device buffer, 1 and 2 are staged
  // (read, no buffer) and get theirs at their fetch, each read once.
  std::vector<int> plan = {0, 1, 2};
  VirtualRun run(3, 1024, limits(1 << 20, 1 << 30, 0), 2 * 2048, 1.0, 1.0);
  run.step(plan);
  run.mover.loads.clear();
  UnitScheduler::Stats before = run.sched.stats();
  EXPECT_DOUBLE_EQ(run.step(plan), 4.0);  // the reads overlap the compute as if on the device
  EXPECT_EQ(run.mover.loads, plan);
  EXPECT_EQ(run.sched.stats().loads_ahead - before.loads_ahead, 3);
  EXPECT_EQ(run.sched.stats().staged_ahead - before.staged_ahead, 2);
  EXPECT_EQ(run.sched.stats().fetched_loading - before.fetched_loading, 3);
  // A chunk in host memory cannot be staged (its copy needs the buffer): each goes ahead only
  // once the buffer before it is free, and the reads no longer overlap.
  run.mover.memory_parts.assign(plan.size(), true);
  before = run.sched.stats();
  EXPECT_DOUBLE_EQ(run.step(plan), 6.0);  // load, compute, three times
  EXPECT_EQ(run.sched.stats().staged_ahead - before.staged_ahead, 0);
}

TEST(UnitScheduler, TheReserveStaysFreeInTheAllocatorNotOnlyAsIdleGatherBuffers) {
  // Room for five gather buffers, two of them the reserve: the handed-over gradient and a
  // reduction buffer, which are not gathers. Idle pool buffers count as room for keeping and
  // loading ahead, yet after every fetch and release both must find room (they failed 21 times
  // in these three steps while idle buffers stood in for the reserve).
  std::vector<int> plan = {0, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 0};
  VirtualRun run(6, 1024, limits(1 << 20, 1 << 30, 1 << 20), 5 * 2048, 1.0, 1.0);
  run.sched.set_reserve(2 * 2048);
  for (int s = 0; s < 3; ++s)
    run.step(plan, 0, [&](int u) {
      auto grad = run.dev.alloc(2048, Tier::kDevice, Kind::kStaging);
      ASSERT_TRUE(grad.ok()) << "step " << s << ", after unit " << u << ": " << grad.status().message();
      auto reduction = run.dev.alloc(2048, Tier::kDevice, Kind::kComm);
      run.dev.free(*grad);
      ASSERT_TRUE(reduction.ok()) << "step " << s << ", after unit " << u << ": " << reduction.status().message();
      run.dev.free(*reduction);
    });
  EXPECT_GT(run.sched.stats().fetched_kept, 0);  // the policy still keeps
}

TEST(UnitScheduler, AQuarterBudgetKeepsTheActivationsRoomAndStillOverlaps) {
  // 16 units, forward and backward, on a device of a quarter of their gathered bytes; the model's
  // activations (512 bytes a fetch, held to the step's end: 16 KiB at the peak, half the budget)
  // must always find room (they cannot evict), and the scheduler still loads ahead, stages and keeps.
  std::vector<int> plan;
  for (int u = 0; u < 16; ++u) plan.push_back(u);
  std::vector<int> fb = plan;
  fb.insert(fb.end(), plan.rbegin(), plan.rend());
  const uint64_t budget = 16 * 8192 / 4;  // units of 8 KiB
  VirtualRun run(16, 4096, limits(2 * 4096, 1 << 30, 4 * 4096), budget, 1.0, 1.0);
  run.step(fb, 512);
  double overlapped = run.step(fb, 512);
  UnitScheduler::Stats st = run.sched.stats();
  EXPECT_LE(run.dev.ledger().snapshot().peak[static_cast<int>(Tier::kDevice)], budget);
  EXPECT_GT(st.loads_ahead, 0);
  EXPECT_GT(st.staged_ahead, 0);
  EXPECT_GT(st.fetched_kept, 0);
  VirtualRun serial(16, 4096, limits(0, 1 << 30, 0), budget, 1.0, 1.0);
  serial.step(fb, 512);
  EXPECT_LT(overlapped, serial.step(fb, 512));
}

}  // namespace
}  // namespace zoe

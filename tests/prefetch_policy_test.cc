// The scheduler's policy on fakes: UnitTrace and PrefetchPolicy are pure, so their decisions,
// and the overlap they buy, are checked here without a device, a store or a clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>

#include "sched/prefetch_policy.h"
#include "sched/unit_trace.h"

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

TEST(PrefetchPolicy, LoadsAheadInPlanOrderWithinTheBucket) {
  PrefetchPolicy p({10, 10, 10, 10, 10}, limits(25, 1000, 0));
  std::vector<int> plan = {0, 1, 2, 3, 4};
  std::vector<R> st(5, R::kAbsent);
  st[0] = R::kGathered;  // in use
  EXPECT_EQ(p.ahead(plan, 1, st), (std::vector<int>{1, 2}));  // a third would make 30 > 25
  st[1] = R::kLoading;
  EXPECT_EQ(p.ahead(plan, 1, st), (std::vector<int>{2}));     // 1 is in flight and counts
  st[2] = R::kGathered;                                        // kept: costs nothing ahead
  EXPECT_EQ(p.ahead(plan, 1, st), (std::vector<int>{3}));
  EXPECT_TRUE(PrefetchPolicy({10}, limits(0, 1000, 0)).ahead({0}, 0, {R::kAbsent}).empty());  // off
}

TEST(PrefetchPolicy, StopsAtTheFirstUnitThatDoesNotFitAndCountsRepeatsOnce) {
  PrefetchPolicy p({10, 50, 10, 10}, limits(100, 1000, 0));
  std::vector<R> st(4, R::kAbsent);
  EXPECT_EQ(p.ahead({0, 0, 2, 2, 3}, 0, st), (std::vector<int>{0, 2, 3}));
  PrefetchPolicy small({10, 50, 10, 10}, limits(40, 1000, 0));
  EXPECT_EQ(small.ahead({0, 1, 2}, 0, st), (std::vector<int>{0}));  // not 2: order is the point
  PrefetchPolicy live({10, 50, 10, 10}, limits(100, 25, 0));
  st[3] = R::kGathered;  // 10 live
  EXPECT_EQ(live.ahead({0, 2}, 0, st), (std::vector<int>{0}));     // 10 + 10 + 10 > 25
}

TEST(PrefetchPolicy, KeepsWhatIsFetchedAgainWithinTheReuseDistance) {
  PrefetchPolicy p({10, 10, 10, 10}, limits(0, 1000, 20));
  std::vector<int> plan = {0, 1, 2, 3, 3, 2, 1, 0};
  std::vector<R> st(4, R::kGathered);
  EXPECT_TRUE(p.keep(plan, 4, 3, st));   // next fetch is 3 itself: distance 0
  EXPECT_TRUE(p.keep(plan, 4, 1, st));   // 3, 2 between: 20
  EXPECT_FALSE(p.keep(plan, 4, 0, st));  // 30 between
  EXPECT_FALSE(p.keep(plan, 8, 0, st));  // not fetched again this step
  EXPECT_FALSE(PrefetchPolicy({10, 10, 10, 10}, limits(0, 1000, 0)).keep(plan, 4, 3, st));
  EXPECT_FALSE(PrefetchPolicy({10, 10, 10, 10}, limits(0, 35, 20)).keep(plan, 4, 3, st));  // 40 live
}

// One step on a virtual clock: a compute worker runs each fetched unit for `compute` time units,
// one I/O worker loads units in the order they are asked for, `load` each. A fetch waits for its
// load. With the policy asking ahead, the step takes about max(compute, io) plus one load.
double simulate(const PrefetchPolicy& p, const std::vector<int>& plan, double compute, double load) {
  size_t n = 0;
  for (int u : plan) n = std::max<size_t>(n, u + 1);
  std::vector<R> st(n, R::kAbsent);
  std::vector<double> ready(n, 0);
  double now = 0, io_free = 0;
  auto issue = [&](int u) {
    io_free = std::max(io_free, now) + load;
    ready[u] = io_free;
    st[u] = R::kLoading;
  };
  for (size_t i = 0; i < plan.size(); ++i) {
    int u = plan[i];
    if (st[u] == R::kAbsent) issue(u);
    now = std::max(now, ready[u]);
    st[u] = R::kGathered;
    for (int v : p.ahead(plan, i + 1, st)) issue(v);
    now += compute;
    st[u] = p.keep(plan, i + 1, u, st) ? R::kGathered : R::kAbsent;
  }
  return now;
}

TEST(PrefetchPolicy, OnAVirtualClockPrefetchHidesTheLoads) {
  std::vector<int> plan;
  for (int u = 0; u < 8; ++u) plan.push_back(u);
  std::vector<int64_t> sizes(8, 100);
  double serial = simulate(PrefetchPolicy(sizes, limits(0, 1 << 30, 0)), plan, 1.0, 1.0);
  double ahead = simulate(PrefetchPolicy(sizes, limits(200, 1 << 30, 0)), plan, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(serial, 16.0);      // load, compute, load, compute...
  EXPECT_DOUBLE_EQ(ahead, 9.0);        // the first load, then compute hides the rest
  // I/O-bound (loads twice compute): the step takes the loads' time plus the last compute.
  EXPECT_DOUBLE_EQ(simulate(PrefetchPolicy(sizes, limits(200, 1 << 30, 0)), plan, 1.0, 2.0), 17.0);
  // Reuse: forward then backward; kept units are not loaded again.
  std::vector<int> fb = plan;
  fb.insert(fb.end(), plan.rbegin(), plan.rend());
  double kept = simulate(PrefetchPolicy(sizes, limits(200, 1 << 30, 1 << 30)), fb, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(kept, 17.0);        // 16 computes and the first load
}

}  // namespace
}  // namespace zoe

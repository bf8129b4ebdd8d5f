// The trace's rows: one per live named thread, and a thread started per step keeps one row. The
// compute fence runs at both ends of a compute span only, and what it waits for at the end is in
// the span.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <latch>
#include <thread>

#include "common/profiler.h"

namespace zoe {
namespace {

int rows_named(const std::string& name) {
  int n = 0;
  for (const auto& [tid, row] : Profiler::get().thread_names()) n += row == name;
  return n;
}

TEST(Profiler, AThreadStartedPerStepKeepsOneRowAndLiveThreadsGetTheirOwn) {
  for (int step = 0; step < 5; ++step)  // one after the other, like the optimizer's pass
    std::thread([] { Profiler::name_thread("per step"); }).join();
  EXPECT_EQ(rows_named("per step"), 1);
  // Two alive at once cannot share a row: both are named before either ends.
  std::latch named(2);
  auto pair = [&] {
    Profiler::name_thread("pair");
    named.arrive_and_wait();
  };
  std::thread a(pair), b(pair);
  a.join();
  b.join();
  EXPECT_EQ(rows_named("pair"), 2);
  std::thread([] { Profiler::name_thread("pair"); }).join();  // and a later one takes one of theirs
  EXPECT_EQ(rows_named("pair"), 2);
}

TEST(Profiler, AComputeFenceRunsAtBothEndsOfComputeSpansOnly) {
  Profiler& p = Profiler::get();
  int fenced = 0;
  const std::function<void()> fence = [&] { ++fenced; };
  p.set_compute_fence(&fence);
  {
    ZOE_SPAN("block 0", "compute", Bucket::kNone);
    EXPECT_EQ(fenced, 1);
  }
  EXPECT_EQ(fenced, 2);
  { ZOE_SPAN("sub-group", "adam", Bucket::kNone); }
  EXPECT_EQ(fenced, 2);
  // What the end's fence waits for (a device draining) is the span's; the start's is not.
  const std::function<void()> slow = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  p.set_compute_fence(&slow);
  const bool was = p.tracing();
  p.enable_trace(true);
  const double t0 = p.now_us();
  { ZOE_SPAN("fenced", "compute", Bucket::kNone); }
  p.enable_trace(was);
  p.set_compute_fence(nullptr);
  double dur = -1;
  for (const TraceEvent& e : p.events())
    if (e.name == "fenced" && e.ts_us >= t0) dur = e.dur_us;
  EXPECT_GE(dur, 20'000);
  EXPECT_LT(dur, 39'000);
  { ZOE_SPAN("block 0", "compute", Bucket::kNone); }  // unset: nothing runs
  EXPECT_EQ(fenced, 2);
}

}  // namespace
}  // namespace zoe

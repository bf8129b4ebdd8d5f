// The trace's rows: one per live named thread, and a thread started per step keeps one row.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace zoe

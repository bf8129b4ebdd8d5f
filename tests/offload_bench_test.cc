// `zoe bench offload` on a small GPT-2: the contract's fields, a state 4x the device budget that
// the offloaded step stays within, and a trace with the workers' rows.
#include <algorithm>
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "offload_bench.h"
#include "test_util.h"

namespace zoe {
namespace {

TEST(OffloadBench, ReportsStepComputeAndIoTimesWithinAQuarterBudget) {
  OffloadBenchOptions o;
  o.shape = {/*n_layer=*/12, /*n_head=*/4, /*n_embd=*/128, /*vocab_size=*/256, /*n_positions=*/64};
  o.T = 16, o.warmup = 1, o.iters = 2;
  std::string dir = test::make_temp_dir("offload");
  o.nvme_dir = dir + "/swap";
  o.trace_path = dir + "/trace.json";
  nlohmann::json j;
  Status st = bench_offload(o, &j, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(j.at("bench"), "offload");
  ASSERT_EQ(j.at("results").size(), 2u);  // scheduler on, off
  for (size_t i = 0; i < j["results"].size(); ++i) {
    const auto& r = j["results"][i];
    const bool scheduler_on = i == 0;
    EXPECT_TRUE(r.at("case").get<std::string>().ends_with(scheduler_on ? "scheduler on" : "scheduler off"));
    double step = r.at("step_s"), compute = r.at("compute_only_s"), io = r.at("io_only_s");
    EXPECT_GT(step, 0);
    EXPECT_GT(compute, 0);
    EXPECT_GT(io, 0);
    EXPECT_DOUBLE_EQ(r.at("ratio").get<double>(), step / std::max(compute, io));
    EXPECT_GE(r.at("state_bytes").get<double>(), 4.0 * r.at("device_budget_bytes").get<double>() * 0.999);
    EXPECT_LE(r.at("peak_device_bytes").get<uint64_t>(), r.at("device_budget_bytes").get<uint64_t>());
    // CPU seconds a step: a step computes, so its user time is positive, and no case of a few
    // hundred ms on a couple of cores can use more than a minute of CPU.
    for (const char* k : {"cpu_user_s", "compute_only_cpu_s"}) {
      EXPECT_GT(r.at(k).get<double>(), 0) << k;
      EXPECT_LT(r.at(k).get<double>(), 60) << k;
    }
    EXPECT_GE(r.at("cpu_sys_s").get<double>(), 0);
    // Parameters on NVMe, a quarter of the state on the device: the step's fetches reach the
    // store. With the scheduler on, the previous update's writes are often still pending when the
    // forward fetches its parameters, and reads served from them are forwarded, not read: on a
    // slow disk all of them can be. Without it, the optimizer's state is read from the device.
    const double read = r.at("nvme_read_mb"), forwarded = r.at("nvme_forwarded_mb");
    EXPECT_GE(read, 0);
    EXPECT_GE(forwarded, 0);
    EXPECT_GT(read + forwarded, 0);
    if (!scheduler_on) {
      EXPECT_GT(read, 0);
    }
    EXPECT_GE(r.at("io_thread_hashed_mb").get<double>(), 0);
    EXPECT_GE(r.at("nvme_written_mb").get<double>(), 0);
    EXPECT_TRUE(r.at("checksums").get<bool>());
    // One ratio a round; the quiet ones are some of them; steal is never negative.
    const auto rounds = r.at("round_ratios").get<std::vector<double>>();
    const auto quiet = r.at("quiet_round_ratios").get<std::vector<double>>();
    ASSERT_EQ(rounds.size(), size_t(o.iters));
    for (double x : rounds) EXPECT_GT(x, 0);
    const double med = r.at("round_ratio_median").get<double>();
    EXPECT_GE(med, *std::min_element(rounds.begin(), rounds.end()));
    EXPECT_LE(med, *std::max_element(rounds.begin(), rounds.end()));
    EXPECT_LE(quiet.size(), rounds.size());
    for (double x : quiet) EXPECT_NE(std::find(rounds.begin(), rounds.end(), x), rounds.end());
    EXPECT_EQ(r.at("quiet_round_ratio_median").is_null(), quiet.empty());
    EXPECT_GE(r.at("steal_s").get<double>(), 0);
    EXPECT_GE(r.at("compute_only_steal_s").get<double>(), 0);
  }
  std::ifstream f(o.trace_path);
  auto trace = nlohmann::json::parse(f);
  std::set<std::string> cats, rows;
  std::set<int> nvme_rows;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") {  // metadata: the rows' names
      if (e.at("name") == "thread_name") rows.insert(e.at("args").at("name").get<std::string>());
      continue;
    }
    cats.insert(e.at("cat").get<std::string>());
    if (e["cat"] == "nvme_read") nvme_rows.insert(e.at("tid").get<int>());
  }
  for (const char* c : {"compute", "all_gather", "nvme_read", "nvme_write", "adam"}) EXPECT_TRUE(cats.count(c)) << c;
  EXPECT_GE(nvme_rows.size(), 2u);  // the waits on the compute row, the transfers on the I/O thread's
  for (const char* row : {"main", "optimizer", "nvme io"}) EXPECT_TRUE(rows.count(row)) << row;
}

}  // namespace
}  // namespace zoe

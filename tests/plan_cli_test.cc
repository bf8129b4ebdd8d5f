// `zoe plan` and `zoe train --plan auto` from outside: it measures, caches what it measured, prints
// its choice, writes a config that trains; a job that fits nowhere is exit 2 naming the closest
// and the smallest changes that fit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace zoe {
namespace {

using test::kZoe;
using test::make_temp_dir;
using test::run_command;

// A small GPT-2 of the demo's data, the NVMe tier under `dir`.
std::string job(const std::string& dir, const std::string& budget = "64MiB") {
  std::string s;
  for (const std::string& kv : std::vector<std::string>{
           "zoe.model.n_layer=2", "zoe.model.n_embd=64", "zoe.model.n_head=2", "zoe.model.n_positions=64",
        "zoe.data.seq_len=64", "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=2",
        "zoe.device_memory_budget='\"" + budget + "\"'", "zoe.host_memory_budget='\"512MiB\"'",
        "zero_optimization.offload_optimizer.nvme_path='\"" + dir + "/nvme\"'", "zoe.checkpoint.dir='\"\"'",
        "zoe.steps=2"})
    s += " --set " + kv;
  return s;
}

TEST(PlanCli, MeasuresCachesPrintsItsChoiceAndWritesAConfigThatTrains) {
  const std::string dir = make_temp_dir("plan_cli");
  const std::string files = " --out " + dir + "/plan.json --cache " + dir + "/cal.json";
  std::string out;
  ASSERT_EQ(run_command(kZoe + " plan" + job(dir) + files, &out), 0) << out;
  for (const char* said : {"cpu adam", "host copy", "nvme", "micro-step", "configurations fit", "step s", "bound"})
    EXPECT_NE(out.find(said), std::string::npos) << said << " missing from:\n" << out;
  EXPECT_EQ(out.find("(cached)"), std::string::npos) << out;
  out.clear();  // run_command appends
  ASSERT_EQ(run_command(kZoe + " plan --json" + job(dir) + files, &out), 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  ASSERT_FALSE(j["plans"].empty());
  double prev = 0;
  for (const auto& p : j["plans"]) {  // fastest first (ties within 1 % the plainest first)
    EXPECT_GT(p["step_s"].get<double>(), 0);
    EXPECT_GE(p["step_s"].get<double>(), prev * 0.99);
    EXPECT_LE(p["device_bytes"].get<double>(), 64.0 * (1 << 20));
    EXPECT_EQ(p["micro_batch"].get<int>() * p["accumulation"].get<int>(), 4);
    prev = p["step_s"];
  }
  out.clear();
  ASSERT_EQ(run_command(kZoe + " plan" + job(dir) + files, &out), 0) << out;
  EXPECT_NE(out.find("(cached)"), std::string::npos) << "a second plan measures again:\n" << out;
  ASSERT_EQ(run_command(kZoe + " train --quiet --config " + dir + "/plan.json --set zoe.steps=2", &out), 0) << out;
}

TEST(PlanCli, AJobThatFitsNowhereIsExitTwoNamingTheBudgetsAndTheClosest) {
  const std::string dir = make_temp_dir("plan_cli_none");
  std::string out;
  EXPECT_EQ(run_command(kZoe + " plan" + job(dir, "64KiB") + " --out " + dir + "/plan.json --cache " + dir +
                            "/cal.json",
                        &out),
            2)
      << out;
  EXPECT_NE(out.find("no configuration of this job fits"), std::string::npos) << out;
  EXPECT_NE(out.find("the closest"), std::string::npos) << out;
  EXPECT_NE(out.find("device"), std::string::npos) << out;
  // The smallest device budget that fits, named as the config takes it, does fit.
  const std::string key = "zoe.device_memory_budget \"";
  const size_t at = out.find(key);
  ASSERT_NE(at, std::string::npos) << out;
  const std::string budget = out.substr(at + key.size(), out.find('"', at + key.size()) - at - key.size());
  EXPECT_NE(budget.find("MiB"), std::string::npos) << budget;
  out.clear();
  EXPECT_EQ(run_command(kZoe + " plan" + job(dir, budget) + " --out " + dir + "/plan.json --cache " + dir + "/cal.json",
                        &out),
            0)
      << "the suggested " << budget << " does not fit:\n" << out;
}

TEST(PlanCli, TrainPlanAutoTrainsThePlansChoice) {
  const std::string dir = make_temp_dir("plan_cli_auto");
  std::string out;
  ASSERT_EQ(run_command("cd " + dir + " && " + kZoe + " train --plan auto" + job(dir), &out), 0) << out;
  EXPECT_NE(out.find("the plan (predicted"), std::string::npos) << out;
  EXPECT_NE(out.find("done: 2 steps"), std::string::npos) << out;
  EXPECT_NE(test::slurp(dir + "/out/plan/calibration.json").find("models"), std::string::npos);
  EXPECT_NE(run_command(kZoe + " train --plan manual", &out), 0);  // auto is the one value
}

// Two ranks: each measures beside the other, rank 0's choice is every rank's (a rank training
// another configuration would fail the engine's agreement at its first collective).
TEST(PlanCli, TrainPlanAutoOnTwoRanksTrainsRankZerosChoiceOnBoth) {
  const std::string dir = make_temp_dir("plan_cli_ranks");
  std::string out;
  ASSERT_EQ(run_command("cd " + dir + " && " + test::kMpirun + "-np 2 " + kZoe + " train --plan auto --report " + dir +
                            "/r.jsonl" + job(dir),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("2 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("collectives"), std::string::npos) << out;
  size_t plans = 0;
  for (size_t at = out.find("the plan (predicted"); at != std::string::npos; at = out.find("the plan (predicted", at + 1))
    ++plans;
  EXPECT_EQ(plans, 1u) << out;  // rank 0 says it
  const std::string report = test::slurp(dir + "/r.jsonl");
  EXPECT_NE(report.find("\"ranks\":2"), std::string::npos) << report;
}

}  // namespace
}  // namespace zoe

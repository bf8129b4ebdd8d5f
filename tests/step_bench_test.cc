// `zoe bench step` on a tiny GPT-2: the contract's result fields, and the PyTorch baseline where a
// python3 with torch exists (elsewhere the bench refuses unless told --no-torch).
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "step_bench.h"

namespace zoe {
namespace {

StepBenchOptions tiny() {
  StepBenchOptions o;
  o.shape = {/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/256, /*n_positions=*/32};
  o.B = 2, o.T = 32, o.warmup = 1, o.iters = 2, o.threads = {1};
  return o;
}

void expect_result_fields(const nlohmann::json& j, bool with_torch) {
  ASSERT_EQ(j.at("bench"), "step");
  ASSERT_EQ(j.at("results").size(), 1u);
  const auto& r = j["results"][0];
  EXPECT_EQ(r.at("unit"), "tokens/s");
  EXPECT_EQ(r.at("threads"), 1);
  EXPECT_NE(r.at("case").get<std::string>().find("L2 C32"), std::string::npos) << r["case"];
  double measured = r.at("measured").get<double>();
  EXPECT_GT(measured, 0);
  EXPECT_NEAR(measured, 2 * 32 / r.at("step_s").get<double>(), 1e-6 * measured);
  EXPECT_TRUE(std::isfinite(r["loss"][1].get<double>()));
  if (with_torch) {
    double base = r.at("baseline").get<double>();
    EXPECT_GT(base, 0);
    EXPECT_NEAR(r.at("ratio").get<double>(), measured / base, 1e-9 * measured / base);
    EXPECT_EQ(r["torch"].at("threads"), 1);
  } else {
    EXPECT_TRUE(r.at("baseline").is_null());
    EXPECT_TRUE(r.at("ratio").is_null());
  }
}

TEST(StepBench, WithoutTorchReportsZoeAloneWithANullBaseline) {
  StepBenchOptions o = tiny();
  o.torch = false;
  nlohmann::json j;
  Status st = bench_step(o, &j, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_result_fields(j, false);
}

TEST(StepBench, PyTorchBaselineIsMeasuredInTheSameRun) {
  nlohmann::json j;
  Status st = bench_step(tiny(), &j, nullptr);
  if (st.code() == Code::kUnsupported) GTEST_SKIP() << st.message();
  ASSERT_TRUE(st.ok()) << st.message();
  expect_result_fields(j, true);
}

TEST(StepBench, RejectsASequenceLongerThanThePositions) {
  StepBenchOptions o = tiny();
  o.T = 64;
  EXPECT_EQ(bench_step(o, nullptr, nullptr).code(), Code::kInvalidInput);
}

}  // namespace
}  // namespace zoe

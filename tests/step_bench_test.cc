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
  // The GEMM peak of each path, one chosen per type, and the step's share of the fp32 one.
  int chosen = 0;
  for (const auto& p : j.at("gemm_peak")) {
    EXPECT_GT(p.at("gflops").get<double>(), 0) << p;
    chosen += p.at("chosen").get<bool>();
  }
  EXPECT_EQ(chosen, 2) << j["gemm_peak"];
  double frac = r.at("gemm_fraction_of_peak").get<double>();
  EXPECT_GT(frac, 0);
  // L2 C32 V256, 64 tokens: 3 x (2 x 24 x 64 x 32^2 + 2 x 64 x 32 x 256) flops a step.
  double gflops = r.at("gemm_gflops").get<double>();
  EXPECT_NEAR(gflops, 12582912.0 / r["step_s"].get<double>() / 1e9, 1e-9 * gflops);
  double peak = 0;
  for (const auto& p : j["gemm_peak"])
    if (p["type"] == "fp32" && p["chosen"].get<bool>()) peak = p["gflops"].get<double>();
  EXPECT_NEAR(frac, gflops / peak, 1e-9 * frac);
  if (with_torch) {
    // Every mode is timed, or says why not; the best of them is at least the eager baseline.
    for (const char* m : {"eager", "autocast_bf16", "compile"}) {
      const auto& v = r.at("torch_modes").at(m);
      EXPECT_TRUE(v.contains("step_s") || v.contains("unsupported") || v.contains("skipped")) << m << ": " << v;
    }
    EXPECT_LE(r.at("ratio_to_best_torch").get<double>(), r.at("ratio").get<double>() * (1 + 1e-12));
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

#include <gtest/gtest.h>

#include "common/config.h"

#include <nlohmann/json.hpp>

namespace zoe {
namespace {

Status parse_error(const std::string& text, std::vector<std::string> sets = {}) {
  auto r = parse_config(text, sets, "test.json");
  return r.ok() ? Status::Ok() : r.status();
}

TEST(Config, DeepSpeedKeysParse) {
  auto r = parse_config(R"({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
    "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95],
    "eps": 1e-6, "weight_decay": 0.1}}, "zero_optimization": {"stage": 3, "overlap_comm": true,
    "offload_optimizer": {"device": "cpu", "pin_memory": true}}, "zoe": {"device_memory_budget": "2GiB"}})",
                        {}, "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->micro_batch, 8);
  EXPECT_EQ(r->grad_accum, 2);
  EXPECT_EQ(r->dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(r->beta2, 0.95);
  EXPECT_EQ(r->stage, 3);
  EXPECT_EQ(r->offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(r->device_memory_budget, uint64_t{2} << 30);
}

TEST(Config, NeitherPrecisionEnabledIsFp32) {
  auto r = parse_config("{}", {}, "t");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dtype, DType::kF32);
}

TEST(Config, UnknownKeyNamesTheClosestKnownOne) {
  Status s = parse_error(R"({"zero_optimization": {"stagee": 2}})");
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("'zero_optimization.stagee'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("did you mean 'zero_optimization.stage'"), std::string::npos) << s.message();
  s = parse_error(R"({"lr": 0.1})");
  EXPECT_NE(s.message().find("optimizer.params.lr"), std::string::npos) << s.message();
}

TEST(Config, BadValuesNameTheKey) {
  struct Case {
    const char* json;
    const char* needle;
  } cases[] = {
      {R"({"zero_optimization": {"stage": 4}})", "'zero_optimization.stage'"},
      {R"({"optimizer": {"params": {"lr": -0.1}}})", "'optimizer.params.lr'"},
      {R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})", "nvme_path"},
      {R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})", "at most one"},
      {R"({"optimizer": {"params": {"betas": [0.9]}}})", "betas"},
      {R"({"train_micro_batch_size_per_gpu": "auto"})", "auto"},
      {R"({"zoe": {"device_memory_budget": "lots"}})", "zoe.device_memory_budget"},
      {R"({"zoe": {"model": {"type": "gpt2", "n_embd": 10, "n_head": 3}}})", "n_head"},
      {R"({"zoe": {"model": {"type": "gpt2", "n_positions": 8}, "data": {"seq_len": 16}}})", "zoe.data.seq_len"},
      {"{not json", "not valid JSON"},
  };
  for (auto& c : cases) {
    Status s = parse_error(c.json);
    EXPECT_EQ(s.code(), Code::kInvalidInput) << c.json;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << c.json << " -> " << s.message();
  }
}

TEST(Config, SetOverridesApplyAfterTheFile) {
  auto r = parse_config(R"({"zero_optimization": {"stage": 1}})",
                        {"zero_optimization.stage=3", "zoe.device=cpu", "optimizer.params.betas=[0.5,0.6]"}, "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->stage, 3);
  EXPECT_DOUBLE_EQ(r->beta1, 0.5);
  Status s = parse_error("{}", {"zero_optimization.stage"});
  EXPECT_NE(s.message().find("--set"), std::string::npos);
  s = parse_error("{}", {"zero_optimisation.stage=2"});
  EXPECT_NE(s.message().find("did you mean 'zero_optimization.stage'"), std::string::npos) << s.message();
}

TEST(Config, BytesAcceptUnits) {
  EXPECT_EQ(parse_bytes(nlohmann::json("512MiB"), "k").value(), uint64_t{512} << 20);
  EXPECT_EQ(parse_bytes(nlohmann::json("1.5GB"), "k").value(), uint64_t{1500000000});
  EXPECT_EQ(parse_bytes(nlohmann::json(4096), "k").value(), 4096u);
  EXPECT_FALSE(parse_bytes(nlohmann::json(-1), "k").ok());
  EXPECT_FALSE(parse_bytes(nlohmann::json("3 parsecs"), "k").ok());
  for (const char* huge : {"1e30GiB", "infGiB", "nanGiB", "-infGiB", "2EiB", "1e19"}) {
    auto r = parse_bytes(nlohmann::json(huge), "zoe.device_memory_budget");
    ASSERT_FALSE(r.ok()) << huge;
    EXPECT_EQ(r.status().code(), Code::kInvalidInput) << huge;
    EXPECT_NE(r.status().message().find("zoe.device_memory_budget"), std::string::npos) << huge;
  }
  EXPECT_FALSE(parse_bytes(nlohmann::json(1e30), "k").ok());
}

// zoe.device_memory_budget is "auto" unless given in bytes ("auto" may be written too), and says
// so when written back (resolve_device_budget makes it bytes: CApi.AnAutoDeviceBudgetIsResolvedAtStart).
TEST(Config, TheDeviceBudgetIsAutoUnlessGivenInBytes) {
  auto none = parse_config("{}", {}, "t");
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_TRUE(none->device_memory_budget_auto);
  EXPECT_EQ(config_to_json(*none)["zoe"]["device_memory_budget"], "auto");
  auto written = parse_config(R"({"zoe": {"device_memory_budget": "auto"}})", {}, "t");
  ASSERT_TRUE(written.ok()) << written.status().message();
  EXPECT_TRUE(written->device_memory_budget_auto);
  auto bytes = parse_config("{}", {"zoe.device_memory_budget=\"3GiB\""}, "t");
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  EXPECT_FALSE(bytes->device_memory_budget_auto);
  EXPECT_EQ(bytes->device_memory_budget, uint64_t{3} << 30);
  EXPECT_EQ(config_to_json(*bytes)["zoe"]["device_memory_budget"], uint64_t{3} << 30);
  auto again = parse_config(config_to_json(*bytes).dump(), {}, "t");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_FALSE(again->device_memory_budget_auto);
  EXPECT_FALSE(parse_config(R"({"zoe": {"device_memory_budget": "automatic"}})", {}, "t").ok());
}

TEST(Config, TheGpuIsTheLocalRanksUnlessGiven) {
  auto none = parse_config("{}", {}, "t");
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none->gpu, -1);
  auto one = parse_config("{}", {"zoe.gpu=1"}, "t");
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->gpu, 1);
  auto again = parse_config(config_to_json(*one).dump(), {}, "t");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->gpu, 1);
  for (const char* bad : {"zoe.gpu=-2", "zoe.gpu=1.5", "zoe.gpu=\"0\""}) {
    auto r = parse_config("{}", {bad}, "t");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("zoe.gpu"), std::string::npos) << r.status().message();
  }
}

TEST(Config, EmptySectionsSetNothing) {
  auto r = parse_config(R"({"zero_optimization": {}, "aio": {}, "zoe": {"model": {}}})", {}, "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->stage, 0);
}

TEST(Config, GradAccumDtypeIsDeepSpeeds) {
  auto r = parse_config(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}})", {}, "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->grad_dtype(), DType::kF32);
  EXPECT_EQ(r->dtype, DType::kBF16);
  auto d = parse_config(R"({"bf16": {"enabled": true}})", {}, "t");
  EXPECT_EQ(d->grad_dtype(), DType::kBF16) << "unset: gradients in the weight dtype";
  Status s = parse_error(R"({"data_types": {"grad_accum_dtype": "fp64"}})");
  EXPECT_NE(s.message().find("data_types.grad_accum_dtype"), std::string::npos) << s.message();
}

TEST(Config, Bf16ComputeNeedsBf16WeightsAndGpt2) {
  auto r = parse_config(R"({"bf16": {"enabled": true}, "zoe": {"compute_dtype": "bf16", "model": {"type": "gpt2"}}})",
                        {}, "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->compute_dtype, "bf16");
  EXPECT_EQ(parse_config("{}", {}, "t")->compute_dtype, "auto");
  auto named = parse_config(R"({"zoe": {"compute_dtype": "auto"}})", {}, "t");  // its default, said outright
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(named->compute_dtype, "auto");
  for (const char* bad : {R"({"zoe": {"compute_dtype": "bf16", "model": {"type": "gpt2"}}})",
                          R"({"bf16": {"enabled": true}, "zoe": {"compute_dtype": "bf16", "model": {"type": "mlp"}}})",
                          R"({"zoe": {"compute_dtype": "fp16"}})"}) {
    Status s = parse_error(bad);
    EXPECT_NE(s.message().find("zoe.compute_dtype"), std::string::npos) << bad << ": " << s.message();
  }
}

// Clipping and fp16's loss scaling go with it: the update begun in the backward is speculative,
// taken back where the global norm overrules it (ZeroEngine).
TEST(Config, UpdateInBackwardTakesClippingAndFp16) {
  for (const char* good : {R"({"gradient_clipping": 0, "bf16": {"enabled": true}, "zoe": {"update_in_backward": true}})",
                           R"({"gradient_clipping": 1.0, "zoe": {"update_in_backward": true}})",
                           R"({"gradient_clipping": 1.0, "fp16": {"enabled": true}, "zoe": {"update_in_backward": true}})"}) {
    auto r = parse_config(good, {}, "t");
    ASSERT_TRUE(r.ok()) << good << ": " << r.status().message();
    EXPECT_TRUE(r->update_in_backward);
  }
  EXPECT_FALSE(parse_config("{}", {}, "t")->update_in_backward);
  Status s = parse_error(R"({"zoe": {"update_in_backward": 1}})");
  EXPECT_NE(s.message().find("zoe.update_in_backward"), std::string::npos) << s.message();
}

TEST(Config, OffloadRatioIsAFraction) {
  auto r = parse_config(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.3}}})", {}, "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->offload_optimizer.ratio, 0.3);
  Status s = parse_error(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 1.5}}})");
  EXPECT_NE(s.message().find("offload_optimizer.ratio"), std::string::npos) << s.message();
  auto p = parse_config(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "ratio": 0.25}}})",
                        {}, "t");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_DOUBLE_EQ(p->offload_param.ratio, 0.25);
}

// Inputs fuzz/fuzz_config found crashing or hitting UB (fuzz/regressions/fuzz_config): each is an
// input error naming the problem.
TEST(Config, HostileInputIsAnErrorNotACrash) {
  std::string deep_path = "a";  // --set a.a.a...=1 nests one object per component
  for (int i = 0; i < 70; ++i) deep_path += ".a";
  struct Case {
    std::string json;
    std::vector<std::string> sets;
    const char* needle;
  } cases[] = {
      {"{}", {"zoe.device=\xff"}, "not valid UTF-8"},
      {R"({"seed": 1e300})", {}, "'seed'"},
      {R"({"seed": 9223372036854775808.0})", {}, "'seed'"},
      {R"({"zoe": {"model": {"n_layer": -1e300}}})", {}, "'zoe.model.n_layer'"},
      {R"({"zoe": {"device_memory_budget": "inf"}})", {}, "'zoe.device_memory_budget'"},
      {R"({"seed": )" + std::string(65, '[') + std::string(65, ']') + "}", {}, "deeper than 64"},
      {"{}", {deep_path + "=1"}, "deeper than 64"},
  };
  for (auto& c : cases) {
    Status s = parse_error(c.json, c.sets);
    EXPECT_EQ(s.code(), Code::kInvalidInput) << c.json;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << c.json << " -> " << s.message();
  }
  std::string deep_ok = R"({"seed": )" + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_NE(parse_error(deep_ok).message().find("'seed'"), std::string::npos) << "63 levels parse; seed is no array";
}

}  // namespace
}  // namespace zoe

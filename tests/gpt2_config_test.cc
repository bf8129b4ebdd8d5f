// GPT-2 unit layout (names, shapes, offsets) and the counter-based default initialization.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <vector>

#include "model/gpt2_config.h"

namespace zoe::gpt2 {
namespace {

TEST(Gpt2Config, Gpt2SmallSizes) {
  const Gpt2Shape s;  // defaults are GPT-2 small
  ASSERT_TRUE(validate_shape(s).ok());
  EXPECT_EQ(num_units(s), 14);
  EXPECT_EQ(unit_numel(s, 0), 50257 * 768 + 1024 * 768);
  for (int u = 1; u <= 12; u++) EXPECT_EQ(unit_numel(s, u), 7087872) << u;
  EXPECT_EQ(unit_numel(s, 13), 2 * 768);
  EXPECT_EQ(total_numel(s), 124439808);  // Hugging Face's count for "gpt2"
}

TEST(Gpt2Config, UnitNamesShapesOffsets) {
  const Gpt2Shape s{3, 2, 8, 11, 7};
  EXPECT_EQ(unit_name(s, 0), "embed");
  EXPECT_EQ(unit_name(s, 1), "h.0");
  EXPECT_EQ(unit_name(s, 3), "h.2");
  EXPECT_EQ(unit_name(s, 4), "ln_f");
  EXPECT_EQ(unit_name(s, 5), "");
  EXPECT_TRUE(unit_tensors(s, -1).empty());
  EXPECT_EQ(unit_numel(s, 5), 0);
  const auto block = unit_tensors(s, 3);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"h.2.ln_1.weight", {8}},         {"h.2.ln_1.bias", {8}},
      {"h.2.attn.c_attn.weight", {8, 24}}, {"h.2.attn.c_attn.bias", {24}},
      {"h.2.attn.c_proj.weight", {8, 8}},  {"h.2.attn.c_proj.bias", {8}},
      {"h.2.ln_2.weight", {8}},         {"h.2.ln_2.bias", {8}},
      {"h.2.mlp.c_fc.weight", {8, 32}},   {"h.2.mlp.c_fc.bias", {32}},
      {"h.2.mlp.c_proj.weight", {32, 8}}, {"h.2.mlp.c_proj.bias", {8}}};
  ASSERT_EQ(block.size(), want.size());
  int64_t offset = 0;
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(block[i].name, want[i].first);
    EXPECT_EQ(block[i].shape, want[i].second);
    EXPECT_EQ(block[i].offset, offset) << block[i].name;  // contiguous, in order
    EXPECT_EQ(block[i].weight_decay, want[i].second.size() >= 2) << block[i].name;
    offset += block[i].numel;
  }
  EXPECT_EQ(offset, unit_numel(s, 3));
  const auto embed = unit_tensors(s, 0);
  ASSERT_EQ(embed.size(), 2u);
  EXPECT_EQ(embed[0].name, "wte.weight");
  EXPECT_EQ(embed[0].shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(embed[1].name, "wpe.weight");
  EXPECT_EQ(embed[1].shape, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(embed[1].offset, 88);
  EXPECT_TRUE(embed[0].weight_decay && embed[1].weight_decay);
  const auto lnf = unit_tensors(s, 4);
  ASSERT_EQ(lnf.size(), 2u);
  EXPECT_EQ(lnf[1].name, "ln_f.bias");
  EXPECT_FALSE(lnf[0].weight_decay || lnf[1].weight_decay);
}

TEST(Gpt2Config, ValidateRejectsBadShapes) {
  EXPECT_EQ(validate_shape({12, 5, 768, 50257, 1024}).code(), Code::kInvalidInput);
  EXPECT_EQ(validate_shape({0, 12, 768, 50257, 1024}).code(), Code::kInvalidInput);
  EXPECT_EQ(validate_shape({12, 12, 768, 50257, -1}).code(), Code::kInvalidInput);
}

double mean_of(const float* p, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += p[i];
  return s / n;
}
double std_of(const float* p, int64_t n) {
  const double m = mean_of(p, n);
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (p[i] - m) * (p[i] - m);
  return std::sqrt(s / n);
}

TEST(Gpt2Init, FollowsGpt2Rule) {
  const Gpt2Shape s{4, 4, 128, 1000, 256};
  std::vector<float> buf(unit_numel(s, 2));
  init_unit(s, 2, 1234, buf.data());
  for (const TensorSpec& t : unit_tensors(s, 2)) {
    const float* p = buf.data() + t.offset;
    if (t.name.ends_with(".bias")) {
      for (int64_t i = 0; i < t.numel; i++) ASSERT_EQ(p[i], 0.f) << t.name;
    } else if (t.name.find("ln_") != std::string::npos) {
      for (int64_t i = 0; i < t.numel; i++) ASSERT_EQ(p[i], 1.f) << t.name;
    } else {
      const bool proj = t.name.ends_with("c_proj.weight");
      const double want = proj ? 0.02 / std::sqrt(2.0 * s.n_layer) : 0.02;
      EXPECT_NEAR(std_of(p, t.numel), want, 0.03 * want) << t.name;
      EXPECT_NEAR(mean_of(p, t.numel), 0.0, 0.03 * want) << t.name;
    }
  }
  std::vector<float> embed(unit_numel(s, 0));
  init_unit(s, 0, 1234, embed.data());
  EXPECT_NEAR(std_of(embed.data(), embed.size()), 0.02, 0.0005);
}

// Element e of a unit is std * init_normal(seed, unit, e), whatever the thread count: a rank
// can initialize any unit alone and get the same numbers.
TEST(Gpt2Init, CounterBasedAndThreadIndependent) {
  const Gpt2Shape s{2, 2, 64, 500, 128};
  std::vector<float> a(unit_numel(s, 0)), b(a.size());
  init_unit(s, 0, 99, a.data());
  {
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    init_unit(s, 0, 99, b.data());
  }
  EXPECT_EQ(a, b);
  for (int64_t e : {int64_t{0}, int64_t{17}, int64_t{500 * 64 + 5}})
    EXPECT_EQ(a[e], static_cast<float>(0.02 * init_normal(99, 0, e))) << e;
  init_unit(s, 0, 100, b.data());
  EXPECT_NE(a, b);  // another seed
  std::vector<float> h0(unit_numel(s, 1)), h1(h0.size());
  init_unit(s, 1, 99, h0.data());
  init_unit(s, 2, 99, h1.data());
  EXPECT_NE(h0, h1);  // the same layout in another unit draws other numbers
}

TEST(Gpt2Init, NormalMoments) {
  const int n = 200000;
  double s1 = 0, s2 = 0, tail = 0;
  for (int e = 0; e < n; e++) {
    const double z = init_normal(7, 3, e);
    s1 += z, s2 += z * z, tail += std::fabs(z) > 2;
  }
  EXPECT_NEAR(s1 / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.015);
  EXPECT_NEAR(tail / n, 0.0455, 0.003);  // P(|z| > 2) of a standard normal
}

}  // namespace
}  // namespace zoe::gpt2

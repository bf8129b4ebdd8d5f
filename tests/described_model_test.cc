// A model described from outside (zoe.torch.describe's file, plan/described_model.h): read as
// written, every bad field refused by name, and planned over the micro-steps it offers only.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "plan/described_model.h"
#include "plan/plan_search.h"

namespace zoe {
namespace {

const std::string kGood = R"({"format": "zoe model work 1", "units": [100, 200, 50],
  "unit_names": ["wte.weight", "blocks.0.fc.weight", "ln_f.weight"],
  "micro_steps": [
    {"micro_batch": 4, "checkpointing": false, "tokens": 64, "activation_bytes": 0,
     "fetches": [[0, 0.5, false], [1, 1.0, false], [2, 0.25, false], [2, 0.5, true], [1, 2.0, true], [0, 1.0, true]]},
    {"micro_batch": 2, "checkpointing": false, "tokens": 32, "activation_bytes": 4096,
     "fetches": [[0, 0.25, false], [1, 0.5, false], [2, 0.1, false], [2, 0.2, true], [1, 1.0, true], [0, 0.5, true]]}]})";

TEST(DescribedModel, AGoodFileReadsAsWritten) {
  auto m = parse_described_model(kGood, "good.json");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->unit_elems, (std::vector<int64_t>{100, 200, 50}));
  EXPECT_EQ(m->total_elems(), 350);
  EXPECT_EQ(m->unit_names.at(1), "blocks.0.fc.weight");
  ASSERT_EQ(m->steps.size(), 2u);
  EXPECT_EQ(m->steps[0].micro_batch, 2);  // ascending
  auto w = m->step(4, false);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->tokens, 64);
  ASSERT_EQ(w->fetches.size(), 6u);
  EXPECT_EQ(w->fetches[4].unit, 1);
  EXPECT_DOUBLE_EQ(w->fetches[4].compute_s, 2.0);
  EXPECT_TRUE(w->fetches[4].backward);
  EXPECT_EQ(m->step(2, false)->activation_bytes, 4096u);
  auto missing = m->step(4, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("micro-batch 4 checkpointed"), std::string::npos);
}

// Each bad file is refused, its message naming the field.
TEST(DescribedModel, BadFieldsAreRefusedByName) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string s = kGood;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "not JSON"},
      {with("zoe model work 1", "zoe model work 9"), "\"format\""},
      {with("[100, 200, 50]", "[100, -200, 50]"), "units[1]"},
      {with("[100, 200, 50]", "[100, 2.5, 50]"), "units[1]"},
      {with("[100, 200, 50]", "[]"), "\"units\""},
      {with("[1, 1.0, false]", "[3, 1.0, false]"), "micro_steps[0].fetches[1]'s unit"},
      {with("[1, 1.0, false]", "[1, -1.0, false]"), "micro_steps[0].fetches[1]'s seconds"},
      {with("[1, 1.0, false]", "[1, 1.0]"), "micro_steps[0].fetches[1]"},
      {with("[1, 1.0, false]", "[1, 1.0, 0]"), "micro_steps[0].fetches[1]'s backward"},
      {with("\"micro_batch\": 2", "\"micro_batch\": 0"), "micro_steps[1].micro_batch"},
      {with("\"micro_batch\": 2", "\"micro_batch\": 4"), "repeats micro-batch 4"},
      {with("\"tokens\": 32", "\"tokens\": \"32\""), "micro_steps[1].tokens"},
      {with("\"activation_bytes\": 4096", "\"activation_bytes\": -1"), "micro_steps[1].activation_bytes"},
      {with(", \"activation_bytes\": 4096", ""), "no \"activation_bytes\""},
      {std::string(100, '[') + std::string(100, ']'), "nested too deeply"},
  };
  for (const auto& [text, named] : cases) {
    auto m = parse_described_model(text, "bad.json");
    ASSERT_FALSE(m.ok()) << named;
    EXPECT_EQ(m.status().code(), Code::kInvalidInput);
    EXPECT_NE(m.status().message().find(named), std::string::npos) << m.status().message() << " / " << named;
    EXPECT_NE(m.status().message().find("bad.json"), std::string::npos);
  }
}

TEST(DescribedModel, AFileThatCannotBeOpenedIsAnIoError) {
  auto m = read_described_model("/nonexistent/work.json");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kIo);
}

// A path that never ends is refused after a bounded read, not read until memory runs out.
TEST(DescribedModel, AnEndlessFileIsRefusedAfterABoundedRead) {
  auto m = read_described_model("/dev/zero");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidInput);
  EXPECT_NE(m.status().message().find("larger than"), std::string::npos) << m.status().message();
}

// The search tries the (micro-batch, checkpointing) pairs a described model offers, and no other.
TEST(PlanSearch, TheGridKeepsToTheOfferedMicroSteps) {
  PlanSpace s;
  s.sequences_per_rank = 8;
  s.micro_steps = {{2, false}, {8, true}, {3, false}};  // 3 does not divide 8: never tried
  std::set<std::pair<int, bool>> seen;
  for (const PlanKnobs& k : plan_grid(s)) {
    seen.emplace(k.micro_batch, k.activation_checkpointing);
    EXPECT_EQ(k.micro_batch * k.accumulation, 8);
  }
  EXPECT_EQ(seen, (std::set<std::pair<int, bool>>{{2, false}, {8, true}}));
}

}  // namespace
}  // namespace zoe

// A model described from outside zoe (zoe.torch.describe, python/zoe/describe.py): its units'
// elements and its micro-steps as measured, for `zoe plan --model-work FILE`, which plans that
// model instead of the built-in GPT-2. The file is the user's: every field is checked, and a bad
// one is named in the error.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/step_model.h"
#include "zoe/status.h"

namespace zoe {

struct DescribedStep {
  int micro_batch = 1;
  bool checkpointing = false;
  MicroStepWork work;
};

struct DescribedModel {
  std::vector<int64_t> unit_elems;
  std::vector<std::string> unit_names;  // may be empty
  std::vector<DescribedStep> steps;     // one per (micro_batch, checkpointing), ascending

  int64_t total_elems() const;
  // The measured step at (b, checkpointing); Invalid when it was not described.
  Result<MicroStepWork> step(int micro_batch, bool checkpointing) const;
};

Result<DescribedModel> parse_described_model(const std::string& text, const std::string& origin);
Result<DescribedModel> read_described_model(const std::string& path);

}  // namespace zoe

// The live progress line of `zoe train`: rewritten in place on a terminal, plain lines every
// steps_per_print steps otherwise (logs, CI).
#pragma once
#include <chrono>
#include <cstdint>

#include "train/step_report.h"

namespace zoe {

class Progress {
 public:
  Progress(int64_t total_steps, bool enabled, int every);
  void update(int64_t step, double loss, double tokens_per_s, double step_s, const RankStepFacts& rank0);
  void finish();

 private:
  int64_t total_;
  bool enabled_, tty_;
  int every_;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point start_;
};

std::string human_bytes(uint64_t b);  // decimal: "1.23 GB"

}  // namespace zoe

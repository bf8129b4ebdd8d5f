// `zoe bench step`: tokens/s of one GPT-2 training step (forward, backward, AdamW) in zoe against
// PyTorch training the same model in the same run (bench/torch_gpt2_step.py, a subprocess).
// zoe drives its engine directly (CPU device, one rank, no MPI); both sides are fp32, use the
// same thread count, warm up first and time only steady-state steps.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/gpt2_config.h"
#include "zoe/status.h"

namespace zoe {

struct StepBenchOptions {
  gpt2::Gpt2Shape shape{/*n_layer=*/6, /*n_head=*/6, /*n_embd=*/384, /*vocab_size=*/256, /*n_positions=*/256};
  int B = 4, T = 256;
  int stage = 0;
  std::vector<int> threads;  // one case per count; empty: all cores
  int warmup = 2, iters = 5;
  bool torch = true;         // false: no baseline (ratio null)
  std::string python;        // empty: the first of python3, /usr/bin/python3 that imports torch
};

Status bench_step(const StepBenchOptions& o, nlohmann::json* out, std::FILE* human);

}  // namespace zoe

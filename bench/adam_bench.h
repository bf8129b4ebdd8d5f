// `zoe bench adam`: the fused CPU Adam step's effective bandwidth against a no-arithmetic kernel
// with the same memory traffic (its ceiling) and against torch.optim.AdamW, in the same run.
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zoe/dtype.h"
#include "zoe/status.h"

namespace zoe {

struct BenchAdamOptions {
  std::vector<size_t> sizes = {size_t{64} << 20, size_t{256} << 20};  // elements
  std::vector<DType> grad_dtypes = {DType::kBF16, DType::kF32};
  std::vector<int> threads = {1, 2};
  int iterations = 10;             // timed reps of each kernel; the best is reported
  DType param_dtype = DType::kBF16;  // the weight copy written by each step
  bool torch = true;               // also time torch.optim.AdamW (bench/torch_adam.py)
  int torch_iterations = 5;        // torch's timed steps per variant (each is slow)
  std::string python = "/usr/bin/python3";
};

// Fills *out with {"bench":"adam", "results":[...]} (see bench/RESULTS.md) and, when `human`
// is not null, prints a table there as it goes. A missing torch is reported, not an error.
Status bench_adam(const BenchAdamOptions& o, nlohmann::json* out, std::FILE* human);

}  // namespace zoe

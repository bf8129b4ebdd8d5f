// `zoe bench gemm`: the training step's own products (the GPT-2 linears' forward, input-gradient
// and weight-gradient products, and the tied LM head's, with the shapes, transposes and strides
// the model ops pass) through the path the model uses for each type, three ways each:
//   whole, 1 thread      gemm() on the calling thread (oneDNN's or OpenBLAS's single-threaded kernel);
//   whole, N threads     gemm_threaded(): the library's own threading on the whole product;
//   zoe                  gemm_sliced() over oneTBB's N workers, as the step runs them.
// Each figure is the best of its reps, each way timed alone; "zoe / best" is zoe's
// rate over the better of the two whole ways, per shape and for the step's products together
// (each shape weighted by how often a step runs it).
#pragma once
#include <cstdio>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/gemm.h"
#include "zoe/status.h"

namespace zoe {

struct GemmBenchOptions {
  // The step bench's model (bench/step_bench.h): n_embd, vocabulary, layers, B x T rows.
  int n_embd = 384, vocab = 256, n_layer = 6, rows = 1024;
  std::vector<GemmType> types = {GemmType::kBF16, GemmType::kF32};
  std::vector<int> threads;  // one table per count; empty: all cores
  int reps = 20;             // at least this many timed reps per way (and 0.15 s)
};

Status bench_gemm(const GemmBenchOptions& o, nlohmann::json* out, std::FILE* human);

}  // namespace zoe

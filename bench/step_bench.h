// `zoe bench step`: tokens/s of one GPT-2 training step (forward, backward, AdamW) in zoe against
// PyTorch training the same model in the same run (bench/torch_gpt2_step.py, a subprocess): eager
// fp32 (the baseline of "ratio"), bf16 autocast where the CPU has bf16 units, torch.compile where
// torch has it ("ratio_to_best_torch"). zoe drives its engine directly (CPU device, one rank, no
// MPI) in fp32; both sides use the same thread count, warm up first and time only steady-state
// steps. Beside them, the machine's GEMM peak through each path (kernels/gemm.h) and the fraction
// of the fp32 peak zoe's GEMMs reach in the step (attention's own products are not counted).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <string>

#include "model/gpt2_config.h"
#include "zoe/status.h"

namespace zoe {

struct StepBenchOptions {
  gpt2::Gpt2Shape shape{/*n_layer=*/6, /*n_head=*/6, /*n_embd=*/384, /*vocab_size=*/256, /*n_positions=*/256};
  int B = 4, T = 256;
  int stage = 0;
  bool bf16 = false;  // zoe: bf16 training with bf16 compute (zoe.compute_dtype bf16); else fp32
  bool allow_tf32 = false;  // zoe.allow_tf32 (fp32 products on TF32 tensor cores, cuda device)
  std::vector<int> threads;  // one case per count; empty: all cores
  int warmup = 2, iters = 5;
  bool torch = true;         // false: no baseline (ratio null)
  std::string python;        // empty: the first of python3, /usr/bin/python3 that imports torch
  // The device zoe trains on (zoe.device) and PyTorch's ("cpu" or "cuda").
  std::string device = "cpu";
  uint64_t device_budget = uint64_t{16} << 30;
  // Non-empty: stage 3 with the parameter shard and the optimizer state on NVMe in this folder.
  std::string nvme_dir;
  // Seconds per model op (StepTiming::op_s). On a GPU each op then records two events: the run
  // that times the step against a peer leaves it off.
  bool op_times = true;
};

Status bench_step(const StepBenchOptions& o, nlohmann::json* out, std::FILE* human);

// The pieces bench gpu reuses. Step seconds: the best of the timed steps and their median, and
// the mean forward / backward / optimizer seconds per step.
struct StepTiming {
  double step_s = 0, median_s = 0;
  double forward = 0, backward = 0, optimizer = 0;
  double first_loss = 0, last_loss = 0;
  uint64_t peak_device_bytes = 0, persistent_device_bytes = 0;  // the ledger's, after the run
  std::map<std::string, double> op_s;  // seconds per step in each model op (ModelOps::take_op_seconds)
  // Bytes a timed step moved, on average: host -> device and back (Device::copied_bytes), and
  // what the NVMe stores read and wrote.
  double h2d_bytes = 0, d2h_bytes = 0, nvme_read_bytes = 0, nvme_written_bytes = 0;
  int64_t params = 0;  // the model's parameters
};
Result<StepTiming> time_zoe_step(const StepBenchOptions& o, int threads);
Result<std::string> find_torch_python(const StepBenchOptions& o);
// PyTorch training the same model: bench/torch_gpt2_step.py's JSON line; mode: eager,
// autocast_bf16 or compile; passive: OMP_WAIT_POLICY=PASSIVE (else OpenMP's default).
Result<nlohmann::json> time_torch_step(const StepBenchOptions& o, const std::string& py, int threads,
                                       const std::string& mode = "eager", bool passive = false);

}  // namespace zoe

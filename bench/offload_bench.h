// `zoe bench offload`: how much of stage 3's offload the scheduler hides. One GPT-2 shape whose
// training state (16 bytes per parameter, bf16) is 4x the device budget, parameters and
// optimizer state on NVMe. In the same run, steps interleaved: the offloaded step (stage 3's
// scheduler on, and off); the compute-only step (the same
// model and stage with everything resident); the I/O-only step (the same engine and unit order
// without the model: every fetch's reads and gathers, zero gradients handed over, the optimizer's
// NVMe pass). ratio = step_s / max(compute_only_s, io_only_s): 1.0 is perfect overlap.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "model/gpt2_config.h"
#include "zoe/status.h"

namespace zoe {

struct OffloadBenchOptions {
  gpt2::Gpt2Shape shape{/*n_layer=*/16, /*n_head=*/8, /*n_embd=*/512, /*vocab_size=*/256, /*n_positions=*/256};
  int B = 1, T = 256;
  int warmup = 1, iters = 3;
  int threads = 0;  // compute threads (oneTBB, OpenBLAS) in all three runs; 0: every core
  std::string nvme_dir = "out/bench-offload";
  std::string trace_path;  // non-empty: the Chrome trace of one offloaded step
  bool checksums = true;   // zoe.checksums of the offloaded engines: xxh3 sums per swap block
  int64_t aio_block_size = int64_t{1} << 20;  // aio.block_size, aio.queue_depth of their stores
  int aio_queue_depth = 8;
  // zoe.device of every case: cpu, or cuda (the GPU's offloaded step against its compute-only and
  // I/O-only steps on the same GPU).
  std::string device = "cpu";
};

Status bench_offload(const OffloadBenchOptions& o, nlohmann::json* out, std::FILE* human);

}  // namespace zoe

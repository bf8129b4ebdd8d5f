// The job `zoe train` runs without --config (the README's first command): a small GPT-2 learning
// the embedded public-domain corpus byte by byte, bf16, ZeRO stage 3, the optimizer state (fp32
// master, exp_avg, exp_avg_sq) on the NVMe tier under out/nvme. A 20-step warm-up: after 10, the
// two-rank job's loss jumped 3.8 -> 7.5 at the first step at the peak lr on every product path of
// an AMX machine (AMX, AVX512-BF16, OpenBLAS); after 20 it rises 0.2 at most and ends lower
// (500 steps: 1.907 against 1.976).
#include <fmt/format.h>

#include "cli/commands.h"

namespace zoe::cli {

std::string default_config_json() {
  return fmt::format(R"({{
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "bf16": {{"enabled": true}},
  "optimizer": {{"type": "AdamW", "params": {{"lr": 0.003, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}}},
  "scheduler": {{"type": "WarmupCosineLR", "params": {{"total_num_steps": 500, "warmup_num_steps": 20,
                "warmup_type": "linear", "cos_min_ratio": 0.1}}}},
  "zero_optimization": {{"stage": 3,
                         "offload_optimizer": {{"device": "nvme", "nvme_path": "out/nvme", "pin_memory": true}}}},
  "steps_per_print": 10,
  "seed": 1234,
  "zoe": {{
    "device": "cpu",
    "device_memory_budget": "1GiB",
    "model": {{"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256, "n_positions": 128}},
    "data": {{"train": "{}/data/corpus.txt", "format": "bytes", "seq_len": 128}},
    "steps": 500,
    "checkpoint": {{"dir": "out/checkpoints", "every": 100, "keep": 2}}
  }}
}})",
                     ZOE_SOURCE_DIR);
}

}  // namespace zoe::cli

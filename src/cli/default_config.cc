// The job `zoe train` runs without --config: the README's first command.
#include "cli/commands.h"

namespace zoe::cli {

std::string default_config_json() {
  return R"({
  "train_micro_batch_size_per_gpu": 16,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
  "zero_optimization": {"stage": 3},
  "steps_per_print": 20,
  "seed": 1234,
  "zoe": {
    "device": "cpu",
    "device_memory_budget": "1GiB",
    "model": {"type": "mlp", "n_layer": 6, "n_embd": 128},
    "steps": 200
  }
})";
}

}  // namespace zoe::cli

// The training configuration: DeepSpeed's ds_config key names where the concept is the same,
// zoe's own under `zoe.` (docs/REFERENCE.md, which a test holds to known_config_keys()). Unknown
// keys are errors with the closest known key.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/offload_config.h"
#include "zoe/dtype.h"
#include "zoe/status.h"

namespace zoe {

struct Config {
  // batch
  int micro_batch = 1;                  // train_micro_batch_size_per_gpu
  int grad_accum = 1;                   // gradient_accumulation_steps
  std::optional<int64_t> train_batch;   // train_batch_size (checked against the world)
  double grad_clip = 0.0;               // gradient_clipping, 0 = off
  // precision
  DType dtype = DType::kF32;            // neither bf16 nor fp16 enabled = fp32 training
  std::optional<DType> grad_accum_dtype;  // data_types.grad_accum_dtype; unset: the weight dtype
  double static_loss_scale = 0.0;       // fp16.loss_scale, 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
  // optimizer
  bool adamw = true;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  // scheduler
  std::string scheduler;                // "", "WarmupLR", "WarmupCosineLR"
  double warmup_min_lr = 0.0, warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000, total_num_steps = 0;
  std::string warmup_type = "log";
  double warmup_min_ratio = 0.0, cos_min_ratio = 1e-4;
  // zero
  int stage = 0;
  // Gradient reductions (stages 2-3) run on the engine's communication thread while the backward
  // goes on; at most one unit's and reduce_bucket_size elements are in flight after a hand-over.
  bool overlap_comm = true;
  int64_t reduce_bucket_size = 500000000, allgather_bucket_size = 500000000;
  int64_t prefetch_bucket_size = 50000000, max_live_parameters = 1000000000;
  int64_t max_reuse_distance = 1000000000, param_persistence_threshold = 100000;
  int64_t sub_group_size = 1000000000;
  OffloadConfig offload_optimizer, offload_param;
  int64_t aio_block_size = 1 << 20;
  int aio_queue_depth = 8;
  int steps_per_print = 10;
  uint64_t seed = 1234;
  // zoe
  std::string device = "cpu";
  // zoe.device_memory_budget: bytes, or "auto" (the default: device_memory_budget_auto), which
  // resolve_device_budget (train/backend.h) makes the GPU's free memory less 3 GiB on cuda and 8
  // GiB on the CPU device.
  uint64_t device_memory_budget = uint64_t{8} << 30;
  bool device_memory_budget_auto = true;
  uint64_t host_memory_budget = uint64_t{16} << 30;
  std::string model_type = "mlp";
  int n_layer = 4, n_head = 4, n_embd = 64, vocab_size = 256, n_positions = 256;
  std::string data_train, data_val, data_format = "bytes";
  int seq_len = 64;
  int64_t steps = 10;
  int64_t eval_every = 0;
  std::string init_path;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int checkpoint_keep = 2;
  // Resume checks every checkpoint file's xxh3 (export always does). Independent of `checksums`,
  // which covers swap blocks only: skipping it is a separate, deliberate choice.
  bool checkpoint_verify = true;
  bool activation_checkpointing = false;
  bool checksums = true;
  // Adam steps each unit as soon as its gradient is final, during the backward (speculatively
  // beside clipping or fp16); the trainer announces the lr first (Engine::update_during_backward).
  bool update_in_backward = false;
  // fp32 products on a GPU may round their inputs to TF32 on tensor cores (PyTorch's
  // allow_tf32): faster, no longer fp32-exact. Off, as PyTorch's matmul default; no effect on the
  // CPU device or on bf16 compute.
  bool allow_tf32 = false;
  // Which of the visible GPUs this process uses on the cuda device: -1 (the default) takes its
  // local rank (mpirun's) modulo the GPUs visible; a framework on cuda:N passes N (config_from).
  int gpu = -1;
  // Between GPUs, ZeRO's gradient reduce-scatter as NCCL's own ncclReduceScatter (its ring: fewer
  // passes over memory, no staging buffer; sums in its order, bf16 partial sums rounded at each
  // hop) instead of zoe's rank-order sum (bitwise MpiComm's, the same at every stage). No effect
  // on the CPU device.
  bool nccl_reduce_scatter = false;
  // The products' dtype (GPT-2): "fp32" converts each fetched unit to fp32 and multiplies in fp32;
  // "bf16" (bf16 training only) multiplies the bf16 units in place, activations rounded to bf16,
  // fp32 accumulation (as torch's autocast); "auto" is bf16 in bf16 training where the CPU has
  // bf16 units (kernels/gemm.h: the bf16 path is oneDNN), else fp32. Resolved by compute_bf16().
  std::string compute_dtype = "auto";

  bool mixed_precision() const { return dtype != DType::kF32; }
  // The dtype gradients are accumulated (over micro-steps), reduced and stored in.
  DType grad_dtype() const { return grad_accum_dtype.value_or(dtype); }
};

// A learning rate's bounds, for the config key optimizer.params.lr and for an lr given at run time
// (zoe_step, zoe_update_during_backward): one rule for both, so that no lr reaches Adam that the
// config file would refuse (NaN or 1e300 would make every weight NaN).
inline constexpr double kMinLearningRate = 0.0, kMaxLearningRate = 1e30;
// Ok for a finite lr in [kMinLearningRate, kMaxLearningRate]; else Invalid: "<what> <lr> is not ...".
Status check_learning_rate(double lr, const std::string& what);

// Parses JSON text (a file's contents), applies --set overrides ("a.b.c=<json or bare string>")
// in order, rejects unknown keys and bad values. Errors are kInvalidInput and name the key.
Result<Config> parse_config(const std::string& json_text, const std::vector<std::string>& overrides,
                            const std::string& source_name);
Result<Config> load_config_file(const std::string& path, const std::vector<std::string>& overrides);
// The effective configuration as DeepSpeed-style JSON (for manifests and `--report`).
nlohmann::json config_to_json(const Config& c);
// "4GiB", "512MiB", "1e9", 123 -> bytes.
Result<uint64_t> parse_bytes(const nlohmann::json& v, const std::string& key);
// All known dotted keys (for suggestions and docs).
const std::vector<std::string>& known_config_keys();
// DeepSpeed keys accepted without effect (how zoe always works, or not applicable).
const std::vector<std::string>& accepted_no_effect_config_keys();

}  // namespace zoe

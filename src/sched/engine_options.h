// EngineOptions: what the engine reads of a job's configuration, and nothing else. The job builds
// it from its Config (train/engine_options.h, the one place that fills it), so the engine never
// sees the model, data, schedule or checkpoint keys; each field is the config key named beside it.
// Its defaults are Config's, through engine_options(Config{}): the fields here start at zero.
#pragma once
#include <cstdint>

#include "common/offload_config.h"
#include "zoe/dtype.h"

namespace zoe {

struct EngineOptions {
  int stage = 0;                   // zero_optimization.stage
  DType dtype = DType::kF32;       // the weights' (bf16.enabled / fp16.enabled)
  DType grad_dtype = DType::kF32;  // data_types.grad_accum_dtype, else the weights'
  int grad_accum = 0;              // gradient_accumulation_steps
  double grad_clip = 0;            // gradient_clipping, 0 = off
  // fp16 loss scaling: fp16.loss_scale (0 = dynamic), initial_scale_power, loss_scale_window,
  // hysteresis, min_loss_scale.
  double static_loss_scale = 0;
  int initial_scale_power = 0, loss_scale_window = 0, hysteresis = 0;
  double min_loss_scale = 0;
  // optimizer: AdamW (decoupled decay) or Adam, and its params.
  bool adamw = false;
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  // zero_optimization: overlap_comm, reduce_bucket_size, stage3_prefetch_bucket_size,
  // stage3_max_live_parameters, stage3_max_reuse_distance, sub_group_size, the offload sections.
  bool overlap_comm = false;
  int64_t reduce_bucket_size = 0, prefetch_bucket_size = 0, max_live_parameters = 0, max_reuse_distance = 0;
  int64_t sub_group_size = 0;
  OffloadConfig offload_optimizer, offload_param;
  int64_t aio_block_size = 0;  // aio.block_size
  int aio_queue_depth = 0;     // aio.queue_depth
  uint64_t device_memory_budget = 0, host_memory_budget = 0;  // zoe.*_memory_budget
  bool checksums = false;             // zoe.checksums
  bool update_in_backward = false;    // zoe.update_in_backward

  bool mixed_precision() const { return dtype != DType::kF32; }
};

}  // namespace zoe

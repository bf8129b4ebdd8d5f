#include "train/engine_options.h"

namespace zoe {

EngineOptions engine_options(const Config& c) {
  EngineOptions o;
  o.stage = c.stage;
  o.dtype = c.dtype;
  o.grad_dtype = c.grad_dtype();
  o.grad_accum = c.grad_accum;
  o.grad_clip = c.grad_clip;
  o.static_loss_scale = c.static_loss_scale;
  o.initial_scale_power = c.initial_scale_power;
  o.loss_scale_window = c.loss_scale_window;
  o.hysteresis = c.hysteresis;
  o.min_loss_scale = c.min_loss_scale;
  o.adamw = c.adamw;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.weight_decay = c.weight_decay;
  o.overlap_comm = c.overlap_comm;
  o.reduce_bucket_size = c.reduce_bucket_size;
  o.prefetch_bucket_size = c.prefetch_bucket_size;
  o.max_live_parameters = c.max_live_parameters;
  o.max_reuse_distance = c.max_reuse_distance;
  o.sub_group_size = c.sub_group_size;
  o.offload_optimizer = c.offload_optimizer;
  o.offload_param = c.offload_param;
  o.aio_block_size = c.aio_block_size;
  o.aio_queue_depth = c.aio_queue_depth;
  o.device_memory_budget = c.device_memory_budget;
  o.host_memory_budget = c.host_memory_budget;
  o.checksums = c.checksums;
  o.update_in_backward = c.update_in_backward;
  return o;
}

}  // namespace zoe

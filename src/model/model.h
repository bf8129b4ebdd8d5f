// A model trains through the engine's unit API only (zoe/engine.h): it never sees shards,
// stages or tiers. The built-in models (the MLP test model, GPT-2) implement this interface.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "zoe/engine.h"
#include "zoe/status.h"
#include "zoe/unit.h"

namespace zoe {

// One rank's micro-batch: B sequences of T tokens (inputs and next-token targets), or for the
// synthetic MLP task the index of its first sample.
struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs, targets;
  int64_t first_sample = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  virtual std::vector<UnitSpec> units() const = 0;
  // The default initial values of unit u, full and fp32 (identical on every rank).
  virtual void init_unit(int u, uint64_t seed, float* out) const = 0;
  // Forward + backward of one micro-batch; gradients (of the loss times `loss_scale`, with the loss
  // the mean over this micro-batch) go to the engine unit by unit. Returns the micro-batch loss.
  virtual Result<double> train_micro_step(Engine& e, const Batch& b, float loss_scale) = 0;
  // Forward only: the mean loss over the batch.
  virtual Result<double> eval_loss(Engine& e, const Batch& b) = 0;
  // Tokens (or samples) one micro-batch covers, for throughput figures.
  virtual int64_t tokens_per_batch(const Batch& b) const { return int64_t{b.B} * b.T; }
  // Whether it computes with the device's ops (Device::ops()). Whoever makes its engine builds
  // them first: their workspaces live as long as the job, and taken after the engine's state
  // they would find the device budget's free room in pieces.
  virtual bool uses_device_ops() const { return false; }
};

// Sets every unit's parameters to the model's default initialisation for `seed`.
Status init_params(Engine& e, const Model& model, uint64_t seed);

// For models (and tests) that compute on the host, whatever the device: unit u's full parameters
// as fp32 in host memory (fetch, convert on the device, download, release) ...
Status fetch_to_host(Engine& e, int u, float* dst);
// ... and a gradient computed in host memory handed over from device memory (upload, then
// grads_ready).
Status grads_from_host(Engine& e, int u, const float* grad);

}  // namespace zoe

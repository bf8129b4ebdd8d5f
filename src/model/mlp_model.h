// The test model: a stack of n_layer square linear layers of width n_embd, each with a scalar
// gain (y = g * (xW + b); tanh between layers,
// one unit per layer) regressing a fixed teacher function of synthetic inputs. Small, exact and
// cheap, so the ZeRO pipeline can be checked end to end at every stage and rank count. It computes
// on the host: parameters come down and gradients go up through the engine's device (model.h), so
// it runs on any device, the strict CPU device included.
#pragma once
#include "model/model.h"

namespace zoe {

class MlpModel final : public Model {
 public:
  MlpModel(int n_layer, int width, uint64_t data_seed);
  std::string name() const override { return "mlp"; }
  std::vector<UnitSpec> units() const override;
  void init_unit(int u, uint64_t seed, float* out) const override;
  Result<double> train_micro_step(Engine& e, const Batch& b, float loss_scale) override;
  Result<double> eval_loss(Engine& e, const Batch& b) override;
  int64_t tokens_per_batch(const Batch& b) const override { return b.B; }

  // Sample s of the synthetic task: input x (width values) and target y.
  void sample(int64_t s, float* x, float* y) const;

 private:
  // Forward through all layers; acts[l] is the input of layer l (acts[L] the output).
  Status forward(Engine& e, const Batch& b, std::vector<std::vector<float>>& acts);
  double loss_and_grad(const Batch& b, const std::vector<float>& out, float scale, std::vector<float>* dout) const;

  int L_, D_;
  uint64_t data_seed_;
};

}  // namespace zoe

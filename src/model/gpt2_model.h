// GPT-2 on the unit API: units "embed" (wte, wpe), "h.{i}" (one block each), "ln_f"; the LM head
// is wte. Forward fetches each unit, computes in fp32 and releases it; backward fetches again,
// hands each unit's gradient to the engine and releases. The embedding is fetched twice (token
// embedding, then the LM head) and its gradient handed over once, after the encoder backward.
// Activation checkpointing keeps only block inputs and recomputes each block in backward.
#pragma once
#include <vector>

#include "model/gpt2_block.h"
#include "model/gpt2_config.h"
#include "model/model.h"

namespace zoe {

class Gpt2Model final : public Model {
 public:
  Gpt2Model(const gpt2::Gpt2Shape& shape, bool activation_checkpointing);
  std::string name() const override { return "gpt2"; }
  std::vector<UnitSpec> units() const override;
  void init_unit(int u, uint64_t seed, float* out) const override;
  Result<double> train_micro_step(Engine& e, const Batch& b, float loss_scale) override;
  Result<double> eval_loss(Engine& e, const Batch& b) override;

 private:
  // Fills x_ (block inputs), lnf_ and logits_; returns the mean loss. With dscale != 0, logits_
  // become dlogits * dscale.
  Result<double> forward(Engine& e, const Batch& b, float dscale);
  Status fetch_f32(Engine& e, int u, std::vector<float>& out);
  void size_buffers(const Batch& b);
  uint64_t activation_bytes() const;  // every buffer above: activations, fp32 unit copies, gradients

  gpt2::Gpt2Shape s_;
  bool ckpt_;
  gpt2::BlockDims dims_{};
  // activations, reused across micro-steps (fresh pages are expensive)
  std::vector<std::vector<float>> x_;          // x_[l]: input of block l; x_[L]: input of ln_f
  std::vector<std::vector<float>> acts_mem_;   // per block, or one shared when checkpointing
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, logits_, scratch_, dx_, dlnf_;
  std::vector<float> params_, grad_, embed_grad_;
};

}  // namespace zoe

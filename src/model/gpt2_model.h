// GPT-2 on the unit API: units "embed" (wte, wpe), "h.{i}" (one block each), "ln_f"; the LM head
// is wte. Forward fetches each unit, converts it to fp32 on the device and releases it; backward
// fetches again, hands each unit's gradient (device memory) to the engine and releases. The
// embedding is fetched twice (token embedding, then the LM head) and its gradient handed over
// once, after the encoder backward. Activation checkpointing keeps only block inputs and
// recomputes each block in backward. Every buffer is device memory of the engine's device, and
// every kernel runs through its ops(); the host sees only the loss (one download per micro-step).
#pragma once
#include <vector>

#include "model/gpt2_block.h"
#include "model/gpt2_config.h"
#include "model/model.h"
#include "zoe/device.h"

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
  Status fetch_f32(Engine& e, int u, float* out);
  Status size_buffers(Engine& e, const Batch& b);  // allocates every buffer below
  Result<float*> take(size_t floats);  // one more device buffer of the current set
  void free_buffers();
  // Frees the buffers when a micro-step ends, however it ends.
  struct BuffersHeld {
    Gpt2Model* m;
    ~BuffersHeld() { m->free_buffers(); }
  };

  gpt2::Gpt2Shape s_;
  bool ckpt_;
  gpt2::BlockDims dims_{};
  Device* dev_ = nullptr;     // the device the buffers below live on
  std::vector<Buffer> bufs_;  // every buffer below, held for one micro-step
  std::vector<float*> x_;     // x_[l]: input of block l; x_[L]: input of ln_f
  std::vector<float*> acts_mem_;  // per block, or one shared when checkpointing
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *logits_ = nullptr, *scratch_ = nullptr,
        *dx_ = nullptr, *dlnf_ = nullptr, *params_ = nullptr, *grad_ = nullptr, *embed_grad_ = nullptr,
        *loss_ = nullptr;
  int32_t *inputs_ = nullptr, *targets_ = nullptr;
};

}  // namespace zoe

// GPT-2 on the unit API: units "embed" (wte, wpe), "h.{i}" (one block each), "ln_f"; the LM head
// is wte. Forward fetches each unit, converts it to fp32 on the device and releases it; backward
// fetches again, hands each unit's gradient (device memory) to the engine and releases. The
// embedding is fetched twice (token embedding, then the LM head) and its gradient handed over
// once, after the encoder backward.
// bf16 compute (bf16 training, zoe.compute_dtype; gpt2_ops.h): the products read each bf16 unit in
// place, held fetched while its ops run; only a block's vectors and ln_f are widened to fp32, and
// the LM head's unit stays fetched from the forward's end to its backward. LayerNorm, attention
// and GELU write the linear layers' inputs in bf16, and c_attn's product its q, k, v, kept so for
// the backward; dout is rounded into a booked scratch; attention's products are bf16 too, its
// softmax fp32 (the CUDA device keeps fp32 attention on widened q, k, v). Tests: gpt2_bf16_test,
// HF autocast parity in gpt2_parity_test. Activation checkpointing keeps only block inputs and
// recomputes each block in backward. Every buffer is device memory of the engine's device, and
// every kernel runs through its ops(); the host sees only the loss (one download per micro-step).
// The ops' status is read before each gradient is handed to the engine and after the loss is read:
// a failed op ends the micro-step with its error (gpt2_model.cc, ops_ok).
#pragma once
#include <vector>

#include "model/gpt2_block.h"
#include "model/gpt2_config.h"
#include "model/model.h"
#include "zoe/device.h"

namespace zoe {

class Gpt2Model final : public Model {
 public:
  // bf16_compute: the units are bf16 (bf16 training) and the products run on them in bf16.
  Gpt2Model(const gpt2::Gpt2Shape& shape, bool activation_checkpointing, bool bf16_compute = false);
  std::string name() const override { return "gpt2"; }
  bool uses_device_ops() const override { return true; }
  std::vector<UnitSpec> units() const override;
  void init_unit(int u, uint64_t seed, float* out) const override;
  Result<double> train_micro_step(Engine& e, const Batch& b, float loss_scale) override;
  Result<double> eval_loss(Engine& e, const Batch& b) override;
  // Whether s is the refusal of a micro-batch whose activations the device budget cannot hold
  // (a config error to `zoe train`; to a planner, a micro-batch that does not fit).
  static bool activations_do_not_fit(const Status& s);

 private:
  // Fills x_ (block inputs), lnf_ and logits_ (bf16 compute: lnf16_, logits16_); returns the
  // mean loss. With dscale != 0, the logits become dlogits * dscale.
  Result<double> forward(Engine& e, const Batch& b, float dscale);
  Status fetch_f32(Engine& e, int u, float* out);
  // bf16 compute: unit u fetched and held (its bf16 data) until release_held(); a block's
  // vectors widened into params_ first.
  Result<const uint16_t*> fetch_bf16(Engine& e, int u, bool widen_vectors);
  Status release_held(Engine& e);
  // The device's ops have not failed (ModelOps::status), else a Runtime error naming the op and
  // `before`, the hand-over it stops (of `block`, when not -1). Nothing is formatted unless it failed.
  Status ops_ok(const char* before, int block = -1) const;
  gpt2::BlockWeights block_weights(const uint16_t* unit) const;
  Status block_forward(Engine& e, int l);
  Status block_backward(Engine& e, int l);
  Status size_buffers(Engine& e, const Batch& b);  // allocates every buffer below
  Status lay_out_buffers(Engine& e, const Batch& b);  // size_buffers' allocations, in order
  Result<float*> take(size_t floats);  // one more device buffer of the current set
  void free_buffers();
  // Frees the buffers when a micro-step ends, however it ends, and releases a unit an error left
  // held (its status is the error's, already on its way).
  struct BuffersHeld {
    Gpt2Model* m;
    Engine* e;
    ~BuffersHeld() {
      (void)m->release_held(*e);
      m->free_buffers();
    }
  };

  gpt2::Gpt2Shape s_;
  bool ckpt_;
  bool bf16_;
  int held_ = -1;  // bf16 compute: the unit fetched and not yet released (-1: none)
  const uint16_t* held_data_ = nullptr;  // its bf16 data (device memory)
  gpt2::BlockDims dims_{};
  Device* dev_ = nullptr;     // the device the buffers below live on
  std::vector<Buffer> bufs_;  // every buffer below, held for one micro-step
  bool counting_ = false;     // take() only adds up the bytes (size_buffers' first pass)
  uint64_t counted_ = 0;
  std::vector<float*> x_;     // x_[l]: input of block l; x_[L]: input of ln_f
  std::vector<float*> acts_mem_;  // per block, or one shared when checkpointing
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *logits_ = nullptr, *scratch_ = nullptr,
        *dx_ = nullptr, *dlnf_ = nullptr, *params_ = nullptr, *grad_ = nullptr, *embed_grad_ = nullptr,
        *loss_ = nullptr;
  int32_t *inputs_ = nullptr, *targets_ = nullptr;
  uint16_t* bf16_scratch_ = nullptr;  // bf16 compute: the products' rounded activations
  // bf16 compute: ln_f's output and the logits (then dlogits) in bf16, in place of lnf_, logits_.
  uint16_t *lnf16_ = nullptr, *logits16_ = nullptr;
  float* dx_sums_ = nullptr;           // bf16 compute: dx_'s column sums, with dx_ rounded in bf16_scratch_
};

}  // namespace zoe

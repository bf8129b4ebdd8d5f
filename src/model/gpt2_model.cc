#include "model/gpt2_model.h"

#include <algorithm>

#include "common/profiler.h"
#include "model/gpt2_ops.h"

namespace zoe {

using namespace gpt2;

Gpt2Model::Gpt2Model(const Gpt2Shape& shape, bool activation_checkpointing)
    : s_(shape), ckpt_(activation_checkpointing) {}

std::vector<UnitSpec> Gpt2Model::units() const {
  std::vector<UnitSpec> out;
  for (int u = 0; u < num_units(s_); ++u) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> t;
    for (const auto& spec : unit_tensors(s_, u)) t.emplace_back(spec.name, spec.shape);
    out.push_back(make_unit(unit_name(s_, u), t));
  }
  return out;
}

void Gpt2Model::init_unit(int u, uint64_t seed, float* out) const { gpt2::init_unit(s_, u, seed, out); }

void Gpt2Model::size_buffers(const Batch& b) {
  if (dims_.B == b.B && dims_.T == b.T) return;
  dims_ = {b.B, b.T, s_.n_embd, s_.n_head};
  size_t BT = size_t(b.B) * b.T, C = s_.n_embd, L = s_.n_layer;
  x_.assign(L + 1, std::vector<float>(BT * C));
  acts_mem_.assign(ckpt_ ? 1 : L, std::vector<float>(block_acts_numel(dims_)));
  lnf_.resize(BT * C);
  lnf_mean_.resize(BT);
  lnf_rstd_.resize(BT);
  logits_.resize(BT * s_.vocab_size);
  scratch_.resize(block_scratch_numel(dims_));
  dx_.resize(BT * C);
  dlnf_.resize(BT * C);
}

uint64_t Gpt2Model::activation_bytes() const {
  uint64_t n = lnf_.size() + lnf_mean_.size() + lnf_rstd_.size() + logits_.size() + scratch_.size() + dx_.size() +
               dlnf_.size() + params_.capacity() + grad_.capacity() + embed_grad_.capacity();
  for (auto& v : x_) n += v.size();
  for (auto& v : acts_mem_) n += v.size();
  return n * sizeof(float);
}

Status Gpt2Model::fetch_f32(Engine& e, int u, std::vector<float>& out) {
  ZOE_ASSIGN_OR_RETURN(ParamView p, e.fetch(u));
  out.resize(p.numel);
  weights_to_f32(p.data, p.dtype, p.numel, out.data());
  return e.release(u);
}

Result<double> Gpt2Model::forward(Engine& e, const Batch& b, float dscale) {
  if (b.T > s_.n_positions) return Status::Invalid("sequence length exceeds n_positions");
  size_buffers(b);
  e.set_activation_bytes(activation_bytes());
  const int BT = b.B * b.T, C = s_.n_embd, V = s_.vocab_size, L = s_.n_layer;
  ZOE_RETURN_IF_ERROR(fetch_f32(e, 0, params_));
  {
    ZOE_SPAN("encoder", "compute", Bucket::kForward);
    encoder_forward(x_[0].data(), b.inputs.data(), params_.data(), params_.data() + int64_t{V} * C, b.B, b.T, C);
  }
  for (int l = 0; l < L; ++l) {
    ZOE_RETURN_IF_ERROR(fetch_f32(e, 1 + l, params_));
    ZOE_SPAN("block " + std::to_string(l), "compute", Bucket::kForward);
    BlockActs acts = block_acts_bind(acts_mem_[ckpt_ ? 0 : l].data(), dims_);
    block_forward(x_[l + 1].data(), acts, params_.data(), x_[l].data(), dims_);
  }
  ZOE_RETURN_IF_ERROR(fetch_f32(e, L + 1, params_));
  {
    ZOE_SPAN("ln_f", "compute", Bucket::kForward);
    layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x_[L].data(), params_.data(),
                      params_.data() + C, BT, C);
  }
  ZOE_RETURN_IF_ERROR(fetch_f32(e, 0, params_));  // the tied LM head
  ZOE_SPAN("lm_head", "compute", Bucket::kForward);
  lm_head_forward(logits_.data(), lnf_.data(), params_.data(), BT, C, V);
  float loss = crossentropy_forward_backward(dscale != 0 ? logits_.data() : nullptr, nullptr, logits_.data(),
                                             b.targets.data(), BT, V, dscale);
  return static_cast<double>(loss);
}

Result<double> Gpt2Model::train_micro_step(Engine& e, const Batch& b, float loss_scale) {
  const int BT = b.B * b.T, C = s_.n_embd, V = s_.vocab_size, L = s_.n_layer;
  ZOE_ASSIGN_OR_RETURN(double loss, forward(e, b, loss_scale / static_cast<float>(BT)));
  // params_ still holds the embedding (fp32) from the LM head: its backward needs wte.
  embed_grad_.assign(e.unit(0).numel, 0.0f);
  std::fill(dlnf_.begin(), dlnf_.end(), 0.0f);
  {
    ZOE_SPAN("lm_head backward", "compute", Bucket::kBackward);
    lm_head_backward(dlnf_.data(), embed_grad_.data(), logits_.data(), lnf_.data(), params_.data(), BT, C, V);
  }
  ZOE_RETURN_IF_ERROR(fetch_f32(e, L + 1, params_));
  grad_.assign(e.unit(L + 1).numel, 0.0f);
  std::fill(dx_.begin(), dx_.end(), 0.0f);
  {
    ZOE_SPAN("ln_f backward", "compute", Bucket::kBackward);
    layernorm_backward(dx_.data(), grad_.data(), grad_.data() + C, dlnf_.data(), x_[L].data(), params_.data(),
                       lnf_mean_.data(), lnf_rstd_.data(), BT, C);
  }
  ZOE_RETURN_IF_ERROR(e.grads_ready(L + 1, grad_.data()));
  for (int l = L - 1; l >= 0; --l) {
    ZOE_RETURN_IF_ERROR(fetch_f32(e, 1 + l, params_));
    grad_.assign(e.unit(1 + l).numel, 0.0f);
    {
      ZOE_SPAN("block " + std::to_string(l) + " backward", "compute", Bucket::kBackward);
      BlockActs acts = block_acts_bind(acts_mem_[ckpt_ ? 0 : l].data(), dims_);
      block_backward(dx_.data(), grad_.data(), dx_.data(), acts, params_.data(), x_[l].data(), dims_,
                     scratch_.data(), ckpt_);
    }
    ZOE_RETURN_IF_ERROR(e.grads_ready(1 + l, grad_.data()));
  }
  {
    ZOE_SPAN("encoder backward", "compute", Bucket::kBackward);
    encoder_backward(embed_grad_.data(), embed_grad_.data() + int64_t{V} * C, dx_.data(), b.inputs.data(), b.B, b.T, C);
  }
  ZOE_RETURN_IF_ERROR(e.grads_ready(0, embed_grad_.data()));
  return loss;
}

Result<double> Gpt2Model::eval_loss(Engine& e, const Batch& b) { return forward(e, b, 0.0f); }

}  // namespace zoe

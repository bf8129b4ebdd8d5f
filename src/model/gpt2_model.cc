#include "model/gpt2_model.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/profiler.h"
#include "ops/gpt2_ops.h"
#include "ops/model_ops.h"

namespace zoe {

using namespace gpt2;

Gpt2Model::Gpt2Model(const Gpt2Shape& shape, bool activation_checkpointing, bool bf16_compute)
    : s_(shape), ckpt_(activation_checkpointing), bf16_(bf16_compute) {}

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

void Gpt2Model::free_buffers() {
  for (Buffer& b : bufs_) dev_->free(b);
  bufs_.clear();
}

Result<float*> Gpt2Model::take(size_t floats) {
  if (counting_) {
    counted_ += std::max<size_t>(floats, 1) * 4;
    static float nowhere;  // never read or written: the first pass only sizes
    return &nowhere;
  }
  ZOE_ASSIGN_OR_RETURN(Buffer b, dev_->alloc(std::max<size_t>(floats, 1) * 4, Tier::kDevice, Kind::kActivation));
  bufs_.push_back(b);
  return b.as<float>();
}

// Activations, fp32 unit copies and gradients: device memory, booked as activations, held for
// one micro-step (the device reuses the same blocks next time, so no fresh pages are touched).
// Sized first: a budget that cannot hold them is a bad config naming the need, not an
// out-of-memory error in the middle of the first step.
namespace {
constexpr const char* kActivationsDoNotFit = "config key 'zoe.device_memory_budget': too small for the activations";
}  // namespace

bool Gpt2Model::activations_do_not_fit(const Status& s) {
  return s.code() == Code::kInvalidInput && s.message().rfind(kActivationsDoNotFit, 0) == 0;
}

Status Gpt2Model::size_buffers(Engine& e, const Batch& b) {
  free_buffers();
  counting_ = true;
  counted_ = 0;
  Status sized = lay_out_buffers(e, b);
  counting_ = false;
  ZOE_RETURN_IF_ERROR(sized);
  Status s = lay_out_buffers(e, b);
  if (s.code() != Code::kOutOfMemory) return s;
  free_buffers();
  return Status::Invalid(fmt::format(
      "{} of one micro-batch of B={} x T={} "
      "(vocab_size {}, n_embd {}, n_layer {}): they need {:.3f} GiB on the device ({}); raise the budget, or lower "
      "train_micro_batch_size_per_gpu or zoe.data.seq_len",
      kActivationsDoNotFit, b.B, b.T, s_.vocab_size, s_.n_embd, s_.n_layer, counted_ / double(1 << 30), s.message()));
}

Status Gpt2Model::lay_out_buffers(Engine& e, const Batch& b) {
  dev_ = &e.device();
  dims_ = {b.B, b.T, s_.n_embd, s_.n_head};
  size_t BT = size_t(b.B) * b.T, C = s_.n_embd, L = s_.n_layer;
  int64_t largest = 0;
  for (int u = 0; u < e.num_units(); ++u) largest = std::max(largest, e.unit(u).numel);
  x_.assign(L + 1, nullptr);
  for (auto& x : x_) {
    ZOE_ASSIGN_OR_RETURN(x, take(BT * C));
  }
  acts_mem_.assign(ckpt_ ? 1 : L, nullptr);
  for (auto& a : acts_mem_) {
    ZOE_ASSIGN_OR_RETURN(a, take(block_acts_numel(dims_, bf16_)));
  }
  if (bf16_) {  // the head's input and logits in bf16: half the largest activation, no fp32 copy
    ZOE_ASSIGN_OR_RETURN(float* lnf, take((BT * C + 1) / 2));
    ZOE_ASSIGN_OR_RETURN(float* logits, take((BT * s_.vocab_size + 1) / 2));
    lnf16_ = reinterpret_cast<uint16_t*>(lnf);
    logits16_ = reinterpret_cast<uint16_t*>(logits);
  } else {
    ZOE_ASSIGN_OR_RETURN(lnf_, take(BT * C));
    ZOE_ASSIGN_OR_RETURN(logits_, take(BT * s_.vocab_size));
  }
  ZOE_ASSIGN_OR_RETURN(lnf_mean_, take(BT));
  ZOE_ASSIGN_OR_RETURN(lnf_rstd_, take(BT));
  ZOE_ASSIGN_OR_RETURN(scratch_, take(block_scratch_numel(dims_, bf16_)));
  ZOE_ASSIGN_OR_RETURN(dx_, take(BT * C));
  ZOE_ASSIGN_OR_RETURN(dlnf_, take(BT * C));
  // bf16 compute widens only vectors (13C for a block, 2C for ln_f); the matrices stay bf16.
  ZOE_ASSIGN_OR_RETURN(params_, take(bf16_ ? 13 * C : largest));
  ZOE_ASSIGN_OR_RETURN(grad_, take(largest));
  ZOE_ASSIGN_OR_RETURN(embed_grad_, take(e.unit(0).numel));
  ZOE_ASSIGN_OR_RETURN(loss_, take(1));
  ZOE_ASSIGN_OR_RETURN(float* in, take(BT));  // int32 tokens, 4 bytes each
  ZOE_ASSIGN_OR_RETURN(float* tg, take(BT));
  if (bf16_) {
    ZOE_ASSIGN_OR_RETURN(float* sc, take((block_bf16_scratch_numel(dims_) + 1) / 2));
    bf16_scratch_ = reinterpret_cast<uint16_t*>(sc);
    ZOE_ASSIGN_OR_RETURN(dx_sums_, take(C));
  }
  inputs_ = reinterpret_cast<int32_t*>(in);
  targets_ = reinterpret_cast<int32_t*>(tg);
  return Status::Ok();
}

Status Gpt2Model::fetch_f32(Engine& e, int u, float* out) {
  ZOE_ASSIGN_OR_RETURN(ParamView p, e.fetch(u));
  Status st = dev_->accumulate(out, DType::kF32, p.data, p.dtype, p.numel, false);
  Status rel = e.release(u);
  return st.ok() ? rel : st;
}

Result<const uint16_t*> Gpt2Model::fetch_bf16(Engine& e, int u, bool widen_vectors) {
  ZOE_ASSIGN_OR_RETURN(ParamView p, e.fetch(u));
  held_ = u;
  if (p.dtype != DType::kBF16)
    return Status::Invalid("bf16 compute fetched unit " + std::to_string(u) + " as " + std::string(dtype_name(p.dtype)));
  const auto* unit = static_cast<const uint16_t*>(p.data);
  held_data_ = unit;
  if (!widen_vectors) return unit;
  float* at = params_;
  for (const auto& [offset, n] : block_vectors(s_.n_embd)) {
    ZOE_RETURN_IF_ERROR(dev_->accumulate(at, DType::kF32, unit + offset, DType::kBF16, n, false));
    at += n;
  }
  return unit;
}

Status Gpt2Model::release_held(Engine& e) {
  int u = held_;
  held_ = -1;
  held_data_ = nullptr;
  return u < 0 ? Status::Ok() : e.release(u);
}

BlockWeights Gpt2Model::block_weights(const uint16_t* unit) const { return {params_, unit, bf16_scratch_}; }

Status Gpt2Model::block_forward(Engine& e, int l) {
  BlockActs acts = block_acts_bind(acts_mem_[ckpt_ ? 0 : l], dims_, bf16_);
  if (!bf16_) {
    ZOE_RETURN_IF_ERROR(fetch_f32(e, 1 + l, params_));
    ZOE_SPAN("block " + std::to_string(l), "compute", Bucket::kForward);
    gpt2::block_forward(dev_->ops(), x_[l + 1], acts, params_, x_[l], dims_);
    return Status::Ok();
  }
  ZOE_ASSIGN_OR_RETURN(const uint16_t* unit, fetch_bf16(e, 1 + l, true));
  {
    ZOE_SPAN("block " + std::to_string(l), "compute", Bucket::kForward);
    gpt2::block_forward(dev_->ops(), x_[l + 1], acts, block_weights(unit), x_[l], dims_);
  }
  return release_held(e);
}

Status Gpt2Model::block_backward(Engine& e, int l) {
  BlockActs acts = block_acts_bind(acts_mem_[ckpt_ ? 0 : l], dims_, bf16_);
  BlockWeights w{params_};
  if (bf16_) {
    ZOE_ASSIGN_OR_RETURN(const uint16_t* unit, fetch_bf16(e, 1 + l, true));
    w = block_weights(unit);
  } else {
    ZOE_RETURN_IF_ERROR(fetch_f32(e, 1 + l, params_));
  }
  {  // block_backward overwrites every gradient of the unit: no zeroing pass first
    ZOE_SPAN("block " + std::to_string(l) + " backward", "compute", Bucket::kBackward);
    // bf16 compute: dx_ comes rounded with its sums (ln_f's or the block above's LayerNorm made
    // them), and leaves so for the block below; block 0's goes to the encoder alone.
    const gpt2::RoundedGrad in{bf16_, dx_sums_}, out{bf16_ && l > 0, dx_sums_};
    gpt2::block_backward(dev_->ops(), dx_, grad_, dx_, acts, w, x_[l], dims_, scratch_, ckpt_, in, out);
  }
  ZOE_RETURN_IF_ERROR(release_held(e));
  ZOE_RETURN_IF_ERROR(ops_ok("a block's gradient was handed on", l));
  return e.grads_ready(1 + l, grad_);
}

// Every input indexes wte (the encoder) and every target the logits (the loss), on every backend:
// checked where they enter the model, whatever made the batch (the data loader also checks each
// token as it reads it). B*T compares: nothing beside a step.
namespace {
Status check_batch(const Batch& b, int vocab) {
  const size_t bt = size_t(b.B) * size_t(b.T);
  if (b.B < 1 || b.T < 1 || b.inputs.size() != bt || b.targets.size() != bt)
    return Status::Invalid(fmt::format("a batch of B={} x T={} holds {} inputs and {} targets", b.B, b.T,
                                       b.inputs.size(), b.targets.size()));
  for (const auto* v : {&b.inputs, &b.targets})
    for (size_t i = 0; i < bt; ++i)
      if (static_cast<uint32_t>((*v)[i]) >= static_cast<uint32_t>(vocab))
        return Status::Invalid(fmt::format("batch {} {} (row {}, position {}) is {}: not a token id below vocab_size {}",
                                           v == &b.inputs ? "input" : "target", i, i / b.T, i % b.T, (*v)[i], vocab));
  return Status::Ok();
}
}  // namespace

Result<double> Gpt2Model::forward(Engine& e, const Batch& b, float dscale) {
  if (b.T > s_.n_positions) return Status::Invalid("sequence length exceeds n_positions");
  ZOE_RETURN_IF_ERROR(check_batch(b, s_.vocab_size));
  ZOE_RETURN_IF_ERROR(size_buffers(e, b));
  ModelOps& ops = dev_->ops();
  const int BT = b.B * b.T, C = s_.n_embd, V = s_.vocab_size, L = s_.n_layer;
  ZOE_RETURN_IF_ERROR(dev_->upload(inputs_, b.inputs.data(), size_t(BT) * 4));
  ZOE_RETURN_IF_ERROR(dev_->upload(targets_, b.targets.data(), size_t(BT) * 4));
  if (bf16_) {
    ZOE_ASSIGN_OR_RETURN(const uint16_t* embed, fetch_bf16(e, 0, false));
    {
      ZOE_SPAN("encoder", "compute", Bucket::kForward);
      ops.encoder_forward_bf16(x_[0], inputs_, embed, embed + int64_t{V} * C, b.B, b.T, C);
    }
    ZOE_RETURN_IF_ERROR(release_held(e));
  } else {
    ZOE_RETURN_IF_ERROR(fetch_f32(e, 0, params_));
    ZOE_SPAN("encoder", "compute", Bucket::kForward);
    ops.encoder_forward(x_[0], inputs_, params_, params_ + int64_t{V} * C, b.B, b.T, C);
  }
  for (int l = 0; l < L; ++l) ZOE_RETURN_IF_ERROR(block_forward(e, l));
  ZOE_RETURN_IF_ERROR(fetch_f32(e, L + 1, params_));
  {
    ZOE_SPAN("ln_f", "compute", Bucket::kForward);
    if (bf16_) ops.layernorm_forward_bf16(lnf16_, lnf_mean_, lnf_rstd_, x_[L], params_, params_ + C, BT, C);
    else ops.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x_[L], params_, params_ + C, BT, C);
  }
  // The tied LM head, then the loss (its gradient in place of the logits when training). bf16
  // compute holds the embedding fetched until the head's backward.
  if (bf16_) {
    ZOE_ASSIGN_OR_RETURN(const uint16_t* wte, fetch_bf16(e, 0, false));
    ZOE_SPAN("lm_head", "compute", Bucket::kForward);
    ops.lm_head_forward_bf16(logits16_, lnf16_, wte, BT, C, V);
    ops.crossentropy_bf16(loss_, dscale != 0 ? logits16_ : nullptr, logits16_, targets_, BT, V, dscale);
  } else {
    ZOE_RETURN_IF_ERROR(fetch_f32(e, 0, params_));
    ZOE_SPAN("lm_head", "compute", Bucket::kForward);
    ops.lm_head_forward(logits_, lnf_, params_, BT, C, V);
    ops.crossentropy(loss_, dscale != 0 ? logits_ : nullptr, logits_, targets_, BT, V, dscale);
  }
  float loss = 0;
  ZOE_RETURN_IF_ERROR(dev_->download(&loss, loss_, sizeof(loss)));
  ZOE_RETURN_IF_ERROR(ops_ok("the loss was read"));
  return static_cast<double>(loss);
}

// Ops only enqueue and return nothing: their first failure is read here, before a result of
// theirs leaves the model, so that a failed launch or library call never becomes a finished step.
Status Gpt2Model::ops_ok(const char* before, int block) const {
  const Status s = dev_->ops().status();
  if (s.ok()) return s;
  const std::string where = block < 0 ? before : std::string(before) + " (block " + std::to_string(block) + ")";
  return Status::Runtime("a device op failed (found before " + where + "): " + s.message());
}

Result<double> Gpt2Model::train_micro_step(Engine& e, const Batch& b, float loss_scale) {
  BuffersHeld held{this, &e};
  const int BT = b.B * b.T, C = s_.n_embd, V = s_.vocab_size, L = s_.n_layer;
  ZOE_ASSIGN_OR_RETURN(double loss, forward(e, b, loss_scale / static_cast<float>(BT)));
  ModelOps& ops = dev_->ops();
  // params_ still holds the embedding (fp32) from the LM head, or (bf16 compute) the unit is
  // still held: its backward needs wte.
  ops.zero(embed_grad_, e.unit(0).numel);
  ops.zero(dlnf_, int64_t{BT} * C);
  {
    ZOE_SPAN("lm_head backward", "compute", Bucket::kBackward);
    if (bf16_) {
      ops.lm_head_backward_bf16(dlnf_, embed_grad_, logits16_, lnf16_, held_data_, BT, C, V);
    } else {
      ops.lm_head_backward(dlnf_, embed_grad_, logits_, lnf_, params_, BT, C, V);
    }
  }
  ZOE_RETURN_IF_ERROR(release_held(e));
  ZOE_RETURN_IF_ERROR(fetch_f32(e, L + 1, params_));
  ops.zero(grad_, e.unit(L + 1).numel);
  {
    ZOE_SPAN("ln_f backward", "compute", Bucket::kBackward);
    if (bf16_) {  // dx_ written (no residual: dres null), and rounded with its sums for block L-1
      ops.layernorm_backward_bf16(dx_, bf16_scratch_, dx_sums_, grad_, grad_ + C, nullptr, dlnf_, x_[L], params_,
                                  lnf_mean_, lnf_rstd_, BT, C);
    } else {
      ops.zero(dx_, int64_t{BT} * C);
      ops.layernorm_backward(dx_, grad_, grad_ + C, dlnf_, x_[L], params_, lnf_mean_, lnf_rstd_, BT, C);
    }
  }
  ZOE_RETURN_IF_ERROR(ops_ok("ln_f's gradient was handed on"));
  ZOE_RETURN_IF_ERROR(e.grads_ready(L + 1, grad_));
  for (int l = L - 1; l >= 0; --l) ZOE_RETURN_IF_ERROR(block_backward(e, l));
  {
    ZOE_SPAN("encoder backward", "compute", Bucket::kBackward);
    ops.encoder_backward(embed_grad_, embed_grad_ + int64_t{V} * C, dx_, inputs_, b.B, b.T, C);
  }
  ZOE_RETURN_IF_ERROR(ops_ok("the embedding's gradient was handed on"));
  ZOE_RETURN_IF_ERROR(e.grads_ready(0, embed_grad_));
  return loss;
}

Result<double> Gpt2Model::eval_loss(Engine& e, const Batch& b) {
  BuffersHeld held{this, &e};
  ZOE_ASSIGN_OR_RETURN(double loss, forward(e, b, 0.0f));
  ZOE_RETURN_IF_ERROR(release_held(e));  // bf16 compute's LM head unit
  return loss;
}

}  // namespace zoe

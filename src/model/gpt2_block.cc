// GPT-2 transformer block: composition of the ops in gpt2_ops.h.
#include "model/gpt2_block.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {

// Per token: ln1, qkv(3), atty, res1, ln2, fc(4), fc_gelu(4) = 15 C; 4 LN stats; NH lse. bf16
// compute: all but res1 (14 C) in bf16, after the floats (res1, C), rounded up to whole floats.
int64_t block_acts_numel(const BlockDims& d, bool bf16) {
  const int64_t BT = int64_t{d.B} * d.T, C = d.C;
  return bf16 ? BT * (C + 4 + d.NH) + (BT * 14 * C + 1) / 2 : BT * (15 * C + 4 + d.NH);
}

BlockActs block_acts_bind(float* base, const BlockDims& d, bool bf16) {
  const int64_t BT = int64_t{d.B} * d.T, BTC = BT * d.C;
  BlockActs a;
  float* p = base;
  auto take = [&](int64_t n) { float* r = p; p += n; return r; };
  a.ln1 = bf16 ? nullptr : take(BTC);
  a.ln1_mean = take(BT);
  a.ln1_rstd = take(BT);
  a.qkv = bf16 ? nullptr : take(3 * BTC);
  a.atty = bf16 ? nullptr : take(BTC);
  a.att_lse = take(BT * d.NH);
  a.res1 = take(BTC);
  a.ln2 = bf16 ? nullptr : take(BTC);
  a.ln2_mean = take(BT);
  a.ln2_rstd = take(BT);
  a.fc = bf16 ? nullptr : take(4 * BTC);
  a.fc_gelu = bf16 ? nullptr : take(4 * BTC);
  if (bf16) {
    uint16_t* h = reinterpret_cast<uint16_t*>(p);
    auto take16 = [&](int64_t n) { uint16_t* r = h; h += n; return r; };
    a.ln1_bf16 = take16(BTC);
    a.qkv_bf16 = take16(3 * BTC);
    a.atty_bf16 = take16(BTC);
    a.ln2_bf16 = take16(BTC);
    a.fc_bf16 = take16(4 * BTC);
    a.fc_gelu_bf16 = take16(4 * BTC);
  }
  return a;
}

// Two [BT,4C] buffers reused along backward, plus dres1 and dln [BT,C]; bf16 compute needs only
// the first (the gradients that go on to products are bf16, in BlockWeights::scratch).
int64_t block_scratch_numel(const BlockDims& d, bool bf16) { return (bf16 ? 6 : 10) * int64_t{d.B} * d.T * d.C; }

BlockBuffers::BlockBuffers(const BlockDims& d, bool bf16)
    : acts_mem(block_acts_numel(d, bf16)), scratch(block_scratch_numel(d, bf16)),
      acts(block_acts_bind(acts_mem.data(), d, bf16)) {}

// The most rounded douts held at once: c_fc's [BT,4C], made while c_proj's products still read
// the block's own [BT,C] (block_backward).
int64_t block_bf16_scratch_numel(const BlockDims& d) { return int64_t{d.B} * d.T * 5 * d.C; }

std::array<std::pair<int64_t, int64_t>, 8> block_vectors(int C) {
  const auto sizes = block_tensor_sizes(C);
  std::array<std::pair<int64_t, int64_t>, 8> out;
  int64_t at = 0;
  for (int i = 0, k = 0; i < 12; i++) {
    const bool matrix = i == 2 || i == 4 || i == 8 || i == 10;  // qkv, attproj, fc, fcproj weights
    if (!matrix) out[k++] = {at, sizes[i]};
    at += sizes[i];
  }
  return out;
}

namespace {

// One linear layer's weight in either compute: the fp32 matrix, or the bf16 one.
struct Linear {
  const float* f32;
  const uint16_t* bf16;
  uint16_t* scratch;
};

// The block's four weight matrices, picked from the unit of the compute in use.
struct Linears {
  Linear qkv, attproj, fc, fcproj;
};

Linears linears(const BlockWeights& w, int C) {
  if (!w.bf16) {
    const auto f = block_tensors<const float*>(w.f32, C);
    return {{f.qkv_w, nullptr, nullptr}, {f.attproj_w, nullptr, nullptr}, {f.fc_w, nullptr, nullptr},
            {f.fcproj_w, nullptr, nullptr}};
  }
  const auto b = block_tensors<const uint16_t*>(w.bf16, C);
  return {{nullptr, b.qkv_w, w.scratch}, {nullptr, b.attproj_w, w.scratch}, {nullptr, b.fc_w, w.scratch},
          {nullptr, b.fcproj_w, w.scratch}};
}

// A linear layer's input: fp32, or in bf16 compute the bf16 copy its producer wrote.
struct Input {
  const float* f32;
  const uint16_t* bf16;
};

// A linear layer's output: fp32, or in bf16 compute, where `bf16` is set, rounded to bf16 (c_attn's:
// the attention, its only reader, takes bf16).
struct Output {
  Output(float* f) : f32(f) {}
  Output(float* f, uint16_t* h) : f32(f), bf16(h) {}
  float* f32;
  uint16_t* bf16 = nullptr;
};

void forward(ModelOps& ops, const Linear& l, Output out, Input inp, const float* bias, int N, int C, int OC) {
  if (l.bf16 && out.bf16) ops.matmul_forward_bf16(out.bf16, inp.bf16, l.bf16, bias, N, C, OC);
  else if (l.bf16) ops.matmul_forward_bf16(out.f32, inp.bf16, l.bf16, bias, N, C, OC);
  else ops.matmul_forward(out.f32, inp.f32, l.f32, bias, N, C, OC);
}

// All overwritten: each is the first (dW, dbias: the only) write of its buffer in block_backward.
void backward(ModelOps& ops, const Linear& l, float* dinp, float* dW, float* dbias, const float* dout, Input inp,
              int N, int C, int OC) {
  if (l.bf16) ops.matmul_backward_bf16(dinp, dW, dbias, dout, inp.bf16, l.bf16, N, C, OC, l.scratch, true);
  else ops.matmul_backward(dinp, dW, dbias, dout, inp.f32, l.f32, N, C, OC, true);
}

// LayerNorm into out, or (bf16 compute, out16 set) rounded into out16.
void layernorm(ModelOps& ops, float* out, uint16_t* out16, float* mean, float* rstd, const float* inp,
               const float* w, const float* b, int N, int C) {
  if (out16) ops.layernorm_forward_bf16(out16, mean, rstd, inp, w, b, N, C);
  else ops.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}

// bf16 weights need acts bound for bf16 and fp32 weights fp32 acts: a caller's bug otherwise.
void check_acts(const BlockActs& a, const BlockWeights& w) {
  if ((w.bf16 != nullptr) == (a.ln1_bf16 != nullptr)) return;
  std::fprintf(stderr, "zoe: gpt2 block: %s weights with acts bound for the other compute\n", w.bf16 ? "bf16" : "fp32");
  std::abort();
}

// The vectors, from the fp32 unit or from their packed widened copy (bf16 compute).
BlockTensors<const float*> vectors(const BlockWeights& w, int C) {
  if (!w.bf16) return block_tensors<const float*>(w.f32, C);
  BlockTensors<const float*> t{};
  const float** order[] = {&t.ln1_w, &t.ln1_b, &t.qkv_b, &t.attproj_b, &t.ln2_w, &t.ln2_b, &t.fc_b, &t.fcproj_b};
  const float* at = w.f32;
  int i = 0;
  for (const auto& [offset, n] : block_vectors(C)) {
    *order[i++] = at;
    at += n;
  }
  return t;
}

// Forward up to the GELU output: everything block_backward reads.
void forward_saved(ModelOps& ops, const BlockActs& a, const BlockWeights& w, const float* inp, const BlockDims& d) {
  const auto p = vectors(w, d.C);
  const Linears m = linears(w, d.C);
  const int BT = d.B * d.T, C = d.C;
  check_acts(a, w);
  layernorm(ops, a.ln1, a.ln1_bf16, a.ln1_mean, a.ln1_rstd, inp, p.ln1_w, p.ln1_b, BT, C);
  forward(ops, m.qkv, {a.qkv, a.qkv_bf16}, {a.ln1, a.ln1_bf16}, p.qkv_b, BT, C, 3 * C);
  if (w.bf16) ops.attention_forward_bf16(a.atty_bf16, a.att_lse, a.qkv_bf16, d.B, d.T, C, d.NH);
  else ops.attention_forward(a.atty, a.att_lse, a.qkv, d.B, d.T, C, d.NH);
  forward(ops, m.attproj, a.res1, {a.atty, a.atty_bf16}, p.attproj_b, BT, C, C);
  ops.residual_forward(a.res1, a.res1, inp, int64_t{BT} * C);
  layernorm(ops, a.ln2, a.ln2_bf16, a.ln2_mean, a.ln2_rstd, a.res1, p.ln2_w, p.ln2_b, BT, C);
  if (w.bf16) {  // c_fc and its GELU in one op: a GPU runs the GELU in the product's epilogue
    ops.matmul_gelu_forward_bf16(a.fc_gelu_bf16, a.fc_bf16, a.ln2_bf16, m.fc.bf16, p.fc_b, BT, C, 4 * C);
    return;
  }
  forward(ops, m.fc, a.fc, {a.ln2, a.ln2_bf16}, p.fc_b, BT, C, 4 * C);
  ops.gelu_forward(a.fc_gelu, a.fc, int64_t{BT} * 4 * C);
}

}  // namespace

void block_forward(ModelOps& ops, float* out, const BlockActs& acts, const BlockWeights& w, const float* inp,
                   const BlockDims& d) {
  const auto p = vectors(w, d.C);
  const int BT = d.B * d.T, C = d.C;
  forward_saved(ops, acts, w, inp, d);
  forward(ops, linears(w, C).fcproj, out, {acts.fc_gelu, acts.fc_gelu_bf16}, p.fcproj_b, BT, 4 * C, C);
  ops.residual_forward(out, out, acts.res1, int64_t{BT} * C);
}

void block_backward(ModelOps& ops, float* dinp, float* dparams, const float* dout, const BlockActs& a,
                    const BlockWeights& w, const float* inp, const BlockDims& d, float* scratch, bool recompute,
                    RoundedGrad dout_rounded, RoundedGrad dinp_rounded) {
  const auto p = vectors(w, d.C);
  const auto g = block_tensors<float*>(dparams, d.C);
  const Linears m = linears(w, d.C);
  const int BT = d.B * d.T, C = d.C;
  const int64_t BTC = int64_t{BT} * C;
  if (recompute) forward_saved(ops, a, w, inp, d);
  // The products overwrite their weights' and biases' gradients; LayerNorm's add to theirs.
  for (float* v : {g.ln1_w, g.ln1_b, g.ln2_w, g.ln2_b}) ops.zero(v, C);
  float* buf_a = scratch;                                // [BT,4C]: d fc_gelu, then d atty
  float* buf_b = w.bf16 ? nullptr : buf_a + 4 * BTC;      // fp32 only, [BT,4C]: d fc, then d qkv
  float* dres1 = buf_a + (w.bf16 ? 4 : 8) * BTC;          // [BT,C]
  float* dln = dres1 + BTC;                               // [BT,C]: d ln2, then d ln1
  // MLP branch. dout reaches res1 directly (residual) and through the MLP. Each buffer's first
  // write overwrites it (a product's dinp, GELU's gradient, a copy): no zeroing pass, but for the
  // fp32 attention's dqkv, which its kernel accumulates.
  check_acts(a, w);
  // bf16 compute: c_fc's dout, rounded, beside the block's own rounded dout at the scratch's start.
  uint16_t* dfc16 = w.bf16 ? w.scratch + BTC : nullptr;
  if (w.bf16 && dout_rounded.given) {  // dout rounded, and its sums, by the LayerNorm above
    // c_proj's products and GELU's backward in one op (a GPU runs GELU's in the product's epilogue).
    ops.matmul_gelu_backward_bf16(dfc16, g.fc_b, g.fcproj_w, w.scratch, a.fc_gelu_bf16, m.fcproj.bf16, a.fc_bf16, BT,
                                  4 * C, C, buf_a);
    ops.copy(g.fcproj_b, dout_rounded.sums, C);
  } else {
    backward(ops, m.fcproj, buf_a, g.fcproj_w, g.fcproj_b, dout, {a.fc_gelu, a.fc_gelu_bf16}, BT, 4 * C, C);
    if (w.bf16) ops.gelu_backward_bf16(dfc16, g.fc_b, a.fc_bf16, buf_a, BT, 4 * C, /*overwrite=*/true);
  }
  if (w.bf16) {
    // Each gradient a product reads comes rounded, with its layer's bias gradient, out of the
    // pass that makes it (GELU's, LayerNorm's, the attention's backward); the residual's
    // gradient is folded into LayerNorm's (no copies). One scratch takes each rounded dout in turn.
    uint16_t* dout16 = w.scratch;
    ops.matmul_backward_bf16(dln, g.fc_w, dfc16, a.ln2_bf16, m.fc.bf16, BT, C, 4 * C, /*overwrite=*/true);
    ops.layernorm_backward_bf16(dres1, dout16, g.attproj_b, g.ln2_w, g.ln2_b, /*dres=*/dout, dln, a.res1, p.ln2_w,
                                a.ln2_mean, a.ln2_rstd, BT, C);
    // Attention branch; dout is not read below, so dinp may alias it.
    ops.matmul_backward_bf16(buf_a, g.attproj_w, dout16, a.atty_bf16, m.attproj.bf16, BT, C, C, /*overwrite=*/true);
    ops.attention_backward_bf16(dout16, g.qkv_b, buf_a, a.atty_bf16, a.qkv_bf16, a.att_lse, d.B, d.T, C, d.NH,
                                /*overwrite=*/true);
    ops.matmul_backward_bf16(dln, g.qkv_w, dout16, a.ln1_bf16, m.qkv.bf16, BT, C, 3 * C, /*overwrite=*/true);
    ops.layernorm_backward_bf16(dinp, dinp_rounded.given ? dout16 : nullptr, dinp_rounded.sums, g.ln1_w, g.ln1_b,
                                /*dres=*/dres1, dln, inp, p.ln1_w, a.ln1_mean, a.ln1_rstd, BT, C);
    return;
  }
  ops.gelu_backward(buf_b, a.fc, buf_a, 4 * BTC, /*overwrite=*/true);
  backward(ops, m.fc, dln, g.fc_w, g.fc_b, buf_b, {a.ln2, a.ln2_bf16}, BT, C, 4 * C);
  ops.copy(dres1, dout, BTC);
  ops.layernorm_backward(dres1, g.ln2_w, g.ln2_b, dln, a.res1, p.ln2_w, a.ln2_mean, a.ln2_rstd, BT, C);
  // Attention branch; dout is not read below, so dinp may alias it.
  backward(ops, m.attproj, buf_a, g.attproj_w, g.attproj_b, dres1, {a.atty, a.atty_bf16}, BT, C, C);
  ops.zero(buf_b, 3 * BTC);
  ops.attention_backward(buf_b, buf_a, a.atty, a.qkv, a.att_lse, d.B, d.T, C, d.NH);
  backward(ops, m.qkv, dln, g.qkv_w, g.qkv_b, buf_b, {a.ln1, a.ln1_bf16}, BT, C, 3 * C);
  ops.copy(dinp, dres1, BTC);
  ops.layernorm_backward(dinp, g.ln1_w, g.ln1_b, dln, inp, p.ln1_w, a.ln1_mean, a.ln1_rstd, BT, C);
}

}  // namespace zoe::gpt2

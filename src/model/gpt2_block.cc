// GPT-2 transformer block: composition of the ops in gpt2_ops.h.
#include "model/gpt2_block.h"

#include <algorithm>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"

namespace zoe::gpt2 {

// Per token: ln1, qkv(3), atty, res1, ln2, fc(4), fc_gelu(4) = 15 C; 4 LN stats; NH lse.
int64_t block_acts_numel(const BlockDims& d) {
  return int64_t{d.B} * d.T * (15 * int64_t{d.C} + 4 + d.NH);
}

BlockActs block_acts_bind(float* base, const BlockDims& d) {
  const int64_t BT = int64_t{d.B} * d.T, BTC = BT * d.C;
  BlockActs a;
  float* p = base;
  auto take = [&](int64_t n) { float* r = p; p += n; return r; };
  a.ln1 = take(BTC);
  a.ln1_mean = take(BT);
  a.ln1_rstd = take(BT);
  a.qkv = take(3 * BTC);
  a.atty = take(BTC);
  a.att_lse = take(BT * d.NH);
  a.res1 = take(BTC);
  a.ln2 = take(BTC);
  a.ln2_mean = take(BT);
  a.ln2_rstd = take(BT);
  a.fc = take(4 * BTC);
  a.fc_gelu = take(4 * BTC);
  return a;
}

// Two [BT,4C] buffers reused along backward, plus dres1 and dln [BT,C].
int64_t block_scratch_numel(const BlockDims& d) { return 10 * int64_t{d.B} * d.T * d.C; }

BlockBuffers::BlockBuffers(const BlockDims& d)
    : acts_mem(block_acts_numel(d)), scratch(block_scratch_numel(d)),
      acts(block_acts_bind(acts_mem.data(), d)) {}

// Forward up to the GELU output: everything block_backward reads.
static void forward_saved(ModelOps& ops, const BlockActs& a, const BlockTensors<const float*>& p,
                          const float* inp, const BlockDims& d) {
  const int BT = d.B * d.T, C = d.C;
  ops.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, inp, p.ln1_w, p.ln1_b, BT, C);
  ops.matmul_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, BT, C, 3 * C);
  ops.attention_forward(a.atty, a.att_lse, a.qkv, d.B, d.T, C, d.NH);
  ops.matmul_forward(a.res1, a.atty, p.attproj_w, p.attproj_b, BT, C, C);
  ops.residual_forward(a.res1, a.res1, inp, int64_t{BT} * C);
  ops.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res1, p.ln2_w, p.ln2_b, BT, C);
  ops.matmul_forward(a.fc, a.ln2, p.fc_w, p.fc_b, BT, C, 4 * C);
  ops.gelu_forward(a.fc_gelu, a.fc, int64_t{BT} * 4 * C);
}

void block_forward(ModelOps& ops, float* out, const BlockActs& acts, const float* params, const float* inp,
                   const BlockDims& d) {
  const auto p = block_tensors<const float*>(params, d.C);
  const int BT = d.B * d.T, C = d.C;
  forward_saved(ops, acts, p, inp, d);
  ops.matmul_forward(out, acts.fc_gelu, p.fcproj_w, p.fcproj_b, BT, 4 * C, C);
  ops.residual_forward(out, out, acts.res1, int64_t{BT} * C);
}

void block_backward(ModelOps& ops, float* dinp, float* dparams, const float* dout, const BlockActs& a,
                    const float* params, const float* inp, const BlockDims& d, float* scratch,
                    bool recompute) {
  const auto p = block_tensors<const float*>(params, d.C);
  const auto g = block_tensors<float*>(dparams, d.C);
  const int BT = d.B * d.T, C = d.C;
  const int64_t BTC = int64_t{BT} * C;
  if (recompute) forward_saved(ops, a, p, inp, d);
  float* buf_a = scratch;            // [BT,4C]: d fc_gelu, then d atty
  float* buf_b = buf_a + 4 * BTC;    // [BT,4C]: d fc, then d qkv
  float* dres1 = buf_b + 4 * BTC;    // [BT,C]
  float* dln = dres1 + BTC;          // [BT,C]: d ln2, then d ln1
  // MLP branch. dout reaches res1 directly (residual) and through the MLP.
  ops.zero(buf_a, 4 * BTC);
  ops.matmul_backward(buf_a, g.fcproj_w, g.fcproj_b, dout, a.fc_gelu, p.fcproj_w, BT, 4 * C, C);
  ops.zero(buf_b, 4 * BTC);
  ops.gelu_backward(buf_b, a.fc, buf_a, 4 * BTC);
  ops.zero(dln, BTC);
  ops.matmul_backward(dln, g.fc_w, g.fc_b, buf_b, a.ln2, p.fc_w, BT, C, 4 * C);
  ops.copy(dres1, dout, BTC);
  ops.layernorm_backward(dres1, g.ln2_w, g.ln2_b, dln, a.res1, p.ln2_w, a.ln2_mean, a.ln2_rstd, BT, C);
  // Attention branch; dout is not read below, so dinp may alias it.
  ops.zero(buf_a, BTC);
  ops.matmul_backward(buf_a, g.attproj_w, g.attproj_b, dres1, a.atty, p.attproj_w, BT, C, C);
  ops.zero(buf_b, 3 * BTC);
  ops.attention_backward(buf_b, buf_a, a.qkv, a.att_lse, d.B, d.T, C, d.NH);
  ops.zero(dln, BTC);
  ops.matmul_backward(dln, g.qkv_w, g.qkv_b, buf_b, a.ln1, p.qkv_w, BT, C, 3 * C);
  ops.copy(dinp, dres1, BTC);
  ops.layernorm_backward(dinp, g.ln1_w, g.ln1_b, dln, inp, p.ln1_w, a.ln1_mean, a.ln1_rstd, BT, C);
}

}  // namespace zoe::gpt2

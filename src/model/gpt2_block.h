// One GPT-2 transformer block on the CPU, forward and backward, fp32:
//   res1 = inp + c_proj(attn(c_attn(ln_1(inp))))
//   out  = res1 + mlp.c_proj(gelu(mlp.c_fc(ln_2(res1))))
// Parameters and gradients are the block unit's flat buffer (layout in gpt2_config.h).
// Independent of the engine: the caller owns every buffer; `ops` runs the kernels (on a device,
// or host_model_ops() on host memory).
//
// Activation checkpointing: keep only the block input; give every layer the same scratch
// BlockActs in forward, and call block_backward with recompute = true: it first re-runs the
// forward (up to the GELU, all backward needs) from inp into that scratch.
#pragma once
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops/model_ops.h"

namespace zoe::gpt2 {

struct BlockDims {
  int B, T, C, NH;
};

// The 12 tensors of a block inside its flat buffer, in unit order. P is a pointer type
// (float*, const float*, or double* for the float64 reference in the tests).
template <class P>
struct BlockTensors {
  P ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
      fcproj_b;
};
// Element counts of the 12 tensors, in unit order.
inline std::array<int64_t, 12> block_tensor_sizes(int C) {
  const int64_t c = C;
  return {c, c, c * 3 * c, 3 * c, c * c, c, c, c, c * 4 * c, 4 * c, 4 * c * c, c};
}
template <class P>
BlockTensors<P> block_tensors(P flat, int C) {
  BlockTensors<P> t;
  P* order[] = {&t.ln1_w, &t.ln1_b, &t.qkv_w, &t.qkv_b, &t.attproj_w, &t.attproj_b,
                &t.ln2_w, &t.ln2_b, &t.fc_w,  &t.fc_b,  &t.fcproj_w,  &t.fcproj_b};
  const auto sizes = block_tensor_sizes(C);
  for (int i = 0; i < 12; i++) {
    *order[i] = flat;
    flat += sizes[i];
  }
  return t;
}
inline int64_t block_numel(int C) { return 12 * int64_t{C} * C + 13 * int64_t{C}; }

// What backward needs from forward (all overwritten by forward). BT = B*T. In bf16 compute the
// four inputs of the linear layers (ln1, atty, ln2, fc_gelu), the attention's qkv and GELU's fc
// are kept only rounded to bf16, as their producers write them and as the products, the
// attention, GELU and their backward read them: the *_bf16 pointers are set and those six float
// pointers are null.
struct BlockActs {
  float* ln1;       // [BT,C]   ln_1 output
  float* ln1_mean;  // [BT]
  float* ln1_rstd;  // [BT]
  float* qkv;       // [BT,3C]  c_attn output
  float* atty;      // [BT,C]   attention output, heads concatenated (c_proj input)
  float* att_lse;   // [B,NH,T] attention log-sum-exp per query
  float* res1;      // [BT,C]   inp + attention branch
  float* ln2;       // [BT,C]
  float* ln2_mean;  // [BT]
  float* ln2_rstd;  // [BT]
  float* fc;        // [BT,4C]  mlp.c_fc output (GELU input)
  float* fc_gelu;   // [BT,4C]  GELU output (mlp.c_proj input)
  uint16_t *ln1_bf16 = nullptr, *qkv_bf16 = nullptr, *atty_bf16 = nullptr, *ln2_bf16 = nullptr,
           *fc_bf16 = nullptr, *fc_gelu_bf16 = nullptr;
};
// Floats of one block's BlockActs (fewer in bf16 compute); base: that many floats.
int64_t block_acts_numel(const BlockDims& d, bool bf16 = false);
BlockActs block_acts_bind(float* base, const BlockDims& d, bool bf16 = false);

// Floats of scratch block_backward needs (fewer in bf16 compute).
int64_t block_scratch_numel(const BlockDims& d, bool bf16 = false);

// The weights a block reads. fp32 compute: `f32` is the flat unit. bf16 compute (gpt2_ops.h):
// `bf16` is the gathered bf16 unit, whose matrices the products read in place; `f32` then holds
// only the unit's 8 vectors (LayerNorm weights, biases), widened and packed in unit order (13C
// floats; block_vectors says where each lies in the unit); `scratch` (block_bf16_scratch_numel
// elements) takes each backward's dout rounded. The acts are bound for bf16 (block_acts_bind).
struct BlockWeights {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;  // null: fp32 compute
  uint16_t* scratch = nullptr;
};
int64_t block_bf16_scratch_numel(const BlockDims& d);
// Where the vectors of a block unit lie: {offset, numel} in unit order, 8 of them.
std::array<std::pair<int64_t, int64_t>, 8> block_vectors(int C);

// out[B,T,C] = block(inp[B,T,C]); fills acts. out must not alias inp or acts.
void block_forward(ModelOps& ops, float* out, const BlockActs& acts, const BlockWeights& w, const float* inp,
                   const BlockDims& d);
inline void block_forward(ModelOps& ops, float* out, const BlockActs& acts, const float* params, const float* inp,
                          const BlockDims& d) {
  block_forward(ops, out, acts, BlockWeights{params}, inp, d);
}

// bf16 compute: a residual gradient ([B,T,C]) as a block's linear layers take it, rounded to bf16
// (in the first B*T*C elements of BlockWeights::scratch) with its column sums (C floats): the
// dout of the block's last projection and that projection's bias gradient, made by the
// LayerNorm backward that wrote the fp32 gradient (the block above's, or ln_f's).
struct RoundedGrad {
  bool given = false;  // false: none (dout is rounded by the projection's own pass)
  float* sums = nullptr;
};

// dinp[B,T,C] is OVERWRITTEN with the input gradient (it may alias dout); so is dparams (the
// block's flat grad buffer, every element: no zeroing pass first). acts must hold this block's
// forward state, or any memory of the right size when recompute is true. scratch:
// block_scratch_numel(d, w.bf16 != nullptr) floats. bf16 compute only: dout_rounded given, dout
// also comes rounded in w.scratch with its sums; dinp_rounded given, dinp is left so too for the
// block below.
void block_backward(ModelOps& ops, float* dinp, float* dparams, const float* dout, const BlockActs& acts,
                    const BlockWeights& w, const float* inp, const BlockDims& d, float* scratch, bool recompute,
                    RoundedGrad dout_rounded = {}, RoundedGrad dinp_rounded = {});
inline void block_backward(ModelOps& ops, float* dinp, float* dparams, const float* dout, const BlockActs& acts,
                           const float* params, const float* inp, const BlockDims& d, float* scratch,
                           bool recompute) {
  block_backward(ops, dinp, dparams, dout, acts, BlockWeights{params}, inp, d, scratch, recompute);
}

// Owns one BlockActs and one backward scratch: a convenience for tests and simple callers.
struct BlockBuffers {
  explicit BlockBuffers(const BlockDims& d, bool bf16 = false);
  std::vector<float> acts_mem, scratch;
  BlockActs acts;
};

}  // namespace zoe::gpt2

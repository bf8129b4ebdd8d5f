// GPT-2 compute ops for the CPU, forward and backward, fp32 (after llm.c's train_gpt2.c).
//
// Plain functions on raw row-major float pointers with explicit sizes:
//   B batch, T sequence length, C channels, NH heads (C % NH == 0), V vocabulary,
//   N rows (usually B*T), OC output channels.
// Weights use the Hugging Face Conv1D layout: a linear weight is [C, OC] and y = x @ W + b.
//
// Output rules, the same for every op:
//   - forward outputs (and saved state such as mean/rstd/lse) are overwritten;
//   - every backward output d* is ACCUMULATED (+=): the caller zeroes it first. This lets
//     residual branches and the tied wte (encoder + LM head) sum their gradients in place. Where
//     a backward takes `overwrite`, its outputs are written instead (a block's first writes).
//   - where a backward has several d* outputs, a null one is skipped.
// Unless stated, outputs must not alias inputs.
//
// Threads: GEMMs run on the BLAS library's threads, everything else on oneTBB. Results do not
// depend on the number of TBB threads (reductions use a fixed partition and order).
#pragma once
#include <cstdint>

namespace zoe::gpt2 {

// out[B,T,C] = wte[inp[b,t], :] + wpe[t, :].  inp [B,T] token ids in [0, V).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C);
// dwte[V,C] += scatter of dout by token id; dwpe[maxT,C] rows [0,T) += sum over b of dout.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                      int T, int C);

// out[N,C] = (inp - mean) * rstd * w + b, eps 1e-5 (biased variance, as torch).
// mean[N], rstd[N]: saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C);
// dinp[N,C] +=, dw[C] +=, db[C] +=.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C);

// out[N,OC] = inp[N,C] @ W[C,OC] + bias[OC]. bias may be null.
void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                    int OC);
// dinp[N,C] += dout @ W^T, dW[C,OC] += inp^T @ dout, dbias[OC] += column sums of dout.
// overwrite: dinp = dout @ W^T, dW = inp^T @ dout, dbias = the column sums (old contents never read).
void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp,
                     const float* W, int N, int C, int OC, bool overwrite = false);

// Tied LM head: logits[N,V] = inp[N,C] @ wte^T, wte [V,C] (no bias).
void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V);
// dinp[N,C] += dlogits @ wte, dwte[V,C] += dlogits^T @ inp.
void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                      const float* wte, int N, int C, int V);

// ---- bf16 compute (as torch's CPU autocast): the weights are the gathered bf16 unit, read in
// place (bf16 bit patterns, no fp32 copy), and every product accumulates in fp32. A linear
// layer's input is bf16 already: its producer (layernorm_forward_bf16, attention_forward_bf16,
// gelu_forward_bf16) wrote it rounded, and it is kept that way for the backward. The other
// operands (dout, the LM head's input and dlogits) are rounded into `scratch` first: N*OC
// elements for a linear backward, bf16_scratch_numel(N, C, V) for the LM head. Outputs, their
// dtypes (fp32) and rules are those of the fp32 functions above.
inline int64_t bf16_scratch_numel(int N, int C, int OC) { return int64_t{N} * (int64_t{C} + OC); }
void encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe, int B, int T,
                          int C);
void matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                         int OC);
// The same with out rounded to bf16 (the fp32 result, bias included, then f32_to_bf16), for a
// product whose only reader takes bf16: c_attn's, which the attention reads.
void matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                         int OC);
void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout, const uint16_t* inp,
                          const uint16_t* W, int N, int C, int OC, uint16_t* scratch, bool overwrite = false);
// layernorm_forward and gelu_forward with their outputs rounded to bf16 (the same fp32 values,
// then f32_to_bf16): the products after them read nothing else.
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, int N, int C);
void gelu_forward_bf16(uint16_t* out, const float* inp, int64_t N);
void lm_head_forward_bf16(float* logits, const float* inp, const uint16_t* wte, int N, int C, int V,
                          uint16_t* scratch);
void lm_head_backward_bf16(float* dinp, float* dwte, const float* dlogits, const float* inp, const uint16_t* wte,
                           int N, int C, int V, uint16_t* scratch);
// dst[n] = src[n] rounded to bf16 (round to nearest even, as zoe/dtype.h).
void round_to_bf16(uint16_t* dst, const float* src, int64_t n);

// Causal self-attention on the packed c_attn output.
//   qkv [B,T,3C]: q, k, v along the last axis, head h at channels [h*hs, (h+1)*hs), hs = C/NH.
//   out [B,T,C]:  softmax(q k^T / sqrt(hs), causal) v, heads concatenated.
//   lse [B,NH,T]: log-sum-exp of each query's scaled scores, saved so backward can rebuild the
//                 attention matrix instead of keeping B*NH*T*T floats.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv[B,T,3C] += gradient through q, k and v; dout [B,T,C]; lse from the forward.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B,
                        int T, int C, int NH);
// The same in bf16 compute: qkv is bf16 (c_attn's product wrote it rounded), dout and the
// probabilities are rounded to bf16 for the products (fp32 accumulation), softmax and lse fp32,
// out rounded to bf16, dqkv fp32. lse is only for attention_backward_bf16.
void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH);
void attention_backward_bf16(float* dqkv, const float* dout, const uint16_t* qkv, const float* lse, int B, int T,
                             int C, int NH);

// out[N] = GELU(inp), tanh approximation. out may alias inp.
void gelu_forward(float* out, const float* inp, int64_t N);
// dinp[N] += GELU'(inp) * dout (overwrite: =).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, bool overwrite = false);

// out[N] = inp1 + inp2. out may alias either input.
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N);
// dinp1 += dout, dinp2 += dout (either may be null).
void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t N);

// Fused softmax + cross-entropy over N positions of V logits, targets [N] in [0, V).
// Returns the mean over the N positions of -log softmax(logits)[target].
// losses[N] (may be null): the per-position loss.
// dlogits[N,V] (may be null): OVERWRITTEN with (softmax - onehot(target)) * dscale. The caller
// folds its averaging and loss scale into dscale, e.g. loss_scale / (B*T). dlogits may alias
// logits (in place), which saves the N*V buffer.
float crossentropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                    const int32_t* targets, int N, int V, float dscale);

}  // namespace zoe::gpt2

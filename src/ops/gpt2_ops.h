// GPT-2 compute ops for the CPU, forward and backward, fp32 and bf16 compute (after llm.c's
// train_gpt2.c): the reference every device's ModelOps is held to (model_ops.h).
//
// Plain functions on raw row-major pointers with explicit sizes; the ops, their shapes and
// output rules are written once, in model_ops.def, and declared here from it. Besides them, the
// helpers below.
//
// Threads: GEMMs run on the BLAS library's threads, everything else on oneTBB. Results do not
// depend on the number of TBB threads (reductions use a fixed partition and order).
#pragma once
#include <cstdint>

namespace zoe::gpt2 {

#define ZOE_OP(name, params, args, ptrs) void name params;
#include "ops/model_ops.def"
#undef ZOE_OP

// dst[n] = src[n] rounded to bf16 (round to nearest even, as zoe/dtype.h).
void round_to_bf16(uint16_t* dst, const float* src, int64_t n);
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

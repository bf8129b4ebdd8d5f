// The per-ISA Adam kernels behind adam_step_range (internal to src/cpu).
//
// All three compute, per element and in this order (F = fused multiply-add, one rounding):
//   g  = grad * grad_scale;            lane skipped (state kept) when g is not finite
//   g  = F(l2, master, g)              Adam's L2 term, only if l2 != 0 (never for AdamW)
//   p  = master * decay                AdamW's decoupled decay (decay = 1 for Adam)
//   m  = F(beta1, m, (1 - beta1) * g)
//   v  = F(beta2, v, ((1 - beta2) * g) * g)
//   d  = F(sqrt(v), 1 / sqrt(bc2), eps)
//   master = F(-lr / bc1, m / d, p)
// Every step is a correctly rounded IEEE operation (mul, fma, sqrt, div) and the format
// conversions are exact or round-to-nearest-even, so the scalar path (std::fma), the AVX2 path
// and the AVX-512 path give bitwise-identical master, m, v and weight copy. The one exception:
// the payload of a NaN that is already in the state may travel differently.
#pragma once
#include <cstddef>

#include "kernels/adam.h"
#include "kernels/adam_consts.h"

namespace zoe {

// The vector paths write the weight copy with non-temporal (streaming) stores when the range
// has at least this many elements and param_out is 64-byte aligned: the copy is write-only, so
// a normal store would first read each line for ownership (2 of every 30 bytes moved), and a
// large copy does not stay in cache anyway. The values are the same either way.
inline constexpr size_t kStreamCopyMinElems = 64 * 1024;

size_t adam_range_scalar(const AdamConsts& c, const AdamRange& r);

// Takes back, in place, the step that constants `c` made on one element, from its stepped master,
// m and v and the same gradient: the operations above inverted in reverse order (the step's own
// m / d, then master = (master - step) / decay, m and v solved for; v not below 0). first_step: the
// state before was Adam's zeros. Returns false, touching nothing, where that step skipped the
// lane. gpu/adam_cuda.cu runs the same operations.
bool adam_undo_element(const AdamConsts& c, bool first_step, float grad, float& master, float& m, float& v);
size_t adam_range_avx2(const AdamConsts& c, const AdamRange& r);
// native_bf16: use AVX512-BF16's vcvtneps2bf16 for the weight copy (the CPU must have it).
size_t adam_range_avx512(const AdamConsts& c, const AdamRange& r, bool native_bf16);

}  // namespace zoe

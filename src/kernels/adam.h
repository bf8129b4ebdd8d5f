// Fused Adam / AdamW over a flat range of a shard (torch.optim semantics).
// One pass: gradient (fp32/bf16/fp16) in; fp32 master, exp_avg, exp_avg_sq in and out;
// low-precision weight copy out. The loss-scale unscale, the 1/(ranks*accumulation) average and
// the clipping coefficient are folded into `grad_scale`.
#pragma once
#include <cstddef>
#include <cstdint>

#include "zoe/dtype.h"

namespace zoe {

enum class Isa : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* isa_name(Isa isa);
Isa best_isa();                 // the widest ISA this CPU supports (chosen at run time)
bool isa_supported(Isa isa);
bool isa_has_avx512bf16();     // AVX512-BF16 (vcvtneps2bf16) on top of kAvx512

// Hyperparameters are doubles, as torch's Python floats are: 1 - beta2 of the float 0.999f is
// 1e-6 away (relative) from torch's float(1 - 0.999), which a test at 1e-6 sees.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;    // for ranges with decay set (>= 2-D tensors)
  bool decoupled = true;        // true: AdamW, false: Adam with L2 added to the gradient
  int64_t step = 1;             // 1-based step count after this update (bias correction)
  float grad_scale = 1.0f;      // multiplies every gradient before use
  // Taking back a speculative step first (zoe.update_in_backward beside clipping or loss scaling:
  // the step began before the global norm said how to scale it). With `undo`, each lane is first
  // restored from the step these same hyperparameters made with grad_scale `undo_grad_scale` and
  // the same gradient (adam_undo_element), then stepped as above unless `restore_only`. Lanes that
  // step skipped (gradient not finite) keep their state, and every lane's weight copy is written
  // from its master (the skipped step left those lanes' copies unwritten: a staging buffer's or a
  // write-only window's bytes). Not bitwise: the restored master, m and v are within a few float
  // roundings of what they were (m and v exactly 0 at step 1).
  bool undo = false;
  float undo_grad_scale = 1.0f;
  bool restore_only = false;
};

// Element i of each array belongs to the same parameter. `param_out` may be null (fp32 training,
// where `master` is the weight itself), or alias nothing else.
struct AdamRange {
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* param_out = nullptr;
  DType param_dtype = DType::kBF16;
  size_t n = 0;
  bool decay = true;            // false: weight_decay does not apply (biases, norms)
};

// Elements [begin, end) of r as a range of their own.
AdamRange adam_sub_range(const AdamRange& r, size_t begin, size_t end);

// Steps elements [0, n) of `r` with the given ISA on the calling thread. Lanes whose scaled
// gradient is not finite keep all their state unchanged; the count of such elements is returned.
// (The engine checks the global gradient before any rank steps, so a whole step is skipped on
// overflow; this count is a second line of defence and a report.)
// An ISA the CPU lacks falls back to the next narrower one. All ISAs give bitwise-identical
// results (see kernels/adam_kernels.h), and so does any thread count in adam_step.
size_t adam_step_range(const AdamHyper& h, const AdamRange& r, Isa isa);

// Steps the whole range with oneTBB over `threads` threads (0 = all), static partition.
size_t adam_step(const AdamHyper& h, const AdamRange& r, Isa isa, int threads = 0);

// float64 reference of one element's update, for tests.
void adam_reference_f64(const AdamHyper& h, double g, double& master, double& m, double& v);

}  // namespace zoe

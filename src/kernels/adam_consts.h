// The per-call constants of the fused Adam update, shared by the CPU and CUDA kernels so every
// path computes the same floats from the same AdamHyper.
#pragma once
#include <cmath>

#include "kernels/adam.h"

namespace zoe {

struct AdamConsts {
  float grad_scale;
  float l2;               // Adam: g += l2 * master; 0 (AdamW, or no decay): the term is skipped
  float decay;            // AdamW: master *= decay = 1 - lr * wd (1 for Adam)
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float neg_step_size;    // -lr / (1 - beta1^step)
  float inv_sqrt_bc2;     // 1 / sqrt(1 - beta2^step)
  float eps;
};

// Bias corrections in double, once per call, then rounded to the floats the kernels use, as
// torch rounds its Python-float scalars (1 - beta, lr / bc1, 1 - lr * wd) for a float tensor.
// Host only; the vector kernel files never call it (they get the result), so no copy of it is
// ever compiled with AVX-512 flags.
inline AdamConsts adam_consts(const AdamHyper& h) {
  const double step = static_cast<double>(h.step < 1 ? 1 : h.step);
  const double bc1 = 1.0 - std::pow(h.beta1, step);
  const double bc2 = 1.0 - std::pow(h.beta2, step);
  AdamConsts c;
  c.grad_scale = h.grad_scale;
  c.l2 = h.decoupled ? 0.0f : static_cast<float>(h.weight_decay);
  c.decay = h.decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.neg_step_size = static_cast<float>(-h.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = static_cast<float>(h.eps);
  return c;
}

}  // namespace zoe

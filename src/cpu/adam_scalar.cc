// Placeholder scalar Adam until the fused kernels land (issue 4 replaces this file).
#include <cmath>

#include "cpu/adam.h"

namespace zoe {

size_t adam_step_range(const AdamHyper& h, const AdamRange& r, Isa) {
  double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  float step_size = static_cast<float>(h.lr / bc1);
  float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  size_t bad = 0;
  for (size_t i = 0; i < r.n; ++i) {
    float g = load_as_f32(r.grad, r.grad_dtype, i) * h.grad_scale;
    if (!std::isfinite(g)) {
      ++bad;
      continue;
    }
    float p = r.master[i];
    if (h.decoupled) p *= 1.0f - h.lr * h.weight_decay;
    else g += h.weight_decay * p;
    float m = h.beta1 * r.exp_avg[i] + (1.0f - h.beta1) * g;
    float v = h.beta2 * r.exp_avg_sq[i] + (1.0f - h.beta2) * g * g;
    p -= step_size * m / (std::sqrt(v) / bc2_sqrt + h.eps);
    r.master[i] = p;
    r.exp_avg[i] = m;
    r.exp_avg_sq[i] = v;
    if (r.param_out) store_from_f32(r.param_out, r.param_dtype, i, p);
  }
  return bad;
}

size_t adam_step(const AdamHyper& h, const AdamRange& r, Isa isa, int) { return adam_step_range(h, r, isa); }

void adam_reference_f64(const AdamHyper&, double, double&, double&, double&) {}

}  // namespace zoe

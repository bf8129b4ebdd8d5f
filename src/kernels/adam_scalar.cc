// Reference scalar Adam path, the float64 reference, and the ISA / thread dispatch.
#include <cmath>

#include "kernels/adam.h"
#include "kernels/adam_consts.h"
#include "kernels/adam_kernels.h"
#include "kernels/parallel_chunks.h"

namespace zoe {

// One element, in the order adam_kernels.h fixes. std::fma rounds once, as the vector FMA does,
// so this path is bitwise equal to the AVX2 / AVX-512 ones. Returns false, touching nothing,
// when the scaled gradient is not finite.
static bool adam_element(const AdamConsts& c, float grad, float& master, float& m, float& v) {
  float g = grad * c.grad_scale;
  if (!std::isfinite(g)) return false;
  if (c.l2 != 0.0f) g = std::fma(c.l2, master, g);
  const float p = master * c.decay;
  const float m_new = std::fma(c.beta1, m, c.one_minus_beta1 * g);
  const float v_new = std::fma(c.beta2, v, (c.one_minus_beta2 * g) * g);
  const float denom = std::fma(std::sqrt(v_new), c.inv_sqrt_bc2, c.eps);
  master = std::fma(c.neg_step_size, m_new / denom, p);
  m = m_new;
  v = v_new;
  return true;
}

size_t adam_range_scalar(const AdamConsts& c, const AdamRange& r) {
  size_t nonfinite = 0;
  for (size_t i = 0; i < r.n; ++i) {
    const float g = load_as_f32(r.grad, r.grad_dtype, i);
    if (!adam_element(c, g, r.master[i], r.exp_avg[i], r.exp_avg_sq[i])) {
      ++nonfinite;
      continue;
    }
    if (r.param_out) store_from_f32(r.param_out, r.param_dtype, i, r.master[i]);
  }
  return nonfinite;
}

void adam_reference_f64(const AdamHyper& h, double g, double& master, double& m, double& v) {
  g *= h.grad_scale;
  if (!std::isfinite(g)) return;
  const double lr = h.lr, wd = h.weight_decay, b1 = h.beta1, b2 = h.beta2;
  if (h.decoupled) master *= 1.0 - lr * wd;
  else g += wd * master;
  m = b1 * m + (1.0 - b1) * g;
  v = b2 * v + (1.0 - b2) * g * g;
  const double step = static_cast<double>(h.step < 1 ? 1 : h.step);
  const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
  master -= (lr / bc1) * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
}

// An ISA the CPU lacks falls back to the next narrower one: a wrong request must not be SIGILL.
static Isa usable_isa(Isa isa) {
  if (isa == Isa::kAvx512 && !isa_supported(Isa::kAvx512)) isa = Isa::kAvx2;
  if (isa == Isa::kAvx2 && !isa_supported(Isa::kAvx2)) isa = Isa::kScalar;
  return isa;
}

static size_t run_range(const AdamConsts& c, const AdamRange& r, Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return adam_range_avx512(c, r, isa_has_avx512bf16());
    case Isa::kAvx2: return adam_range_avx2(c, r);
    default: return adam_range_scalar(c, r);
  }
}

// The constants of range r: weight decay only where the range takes it.
static AdamConsts range_consts(AdamHyper h, const AdamRange& r) {
  if (!r.decay) h.weight_decay = 0.0;
  return adam_consts(h);
}

size_t adam_step_range(const AdamHyper& h, const AdamRange& r, Isa isa) {
  if (r.n == 0) return 0;
  return run_range(range_consts(h, r), r, usable_isa(isa));
}

AdamRange adam_sub_range(const AdamRange& r, size_t begin, size_t end) {
  AdamRange s = r;
  s.grad = static_cast<const char*>(r.grad) + begin * dtype_size(r.grad_dtype);
  s.master = r.master + begin;
  s.exp_avg = r.exp_avg + begin;
  s.exp_avg_sq = r.exp_avg_sq + begin;
  if (r.param_out) s.param_out = static_cast<char*>(r.param_out) + begin * dtype_size(r.param_dtype);
  s.n = end - begin;
  return s;
}

size_t adam_step(const AdamHyper& h, const AdamRange& r, Isa isa, int threads) {
  if (r.n == 0) return 0;
  const AdamConsts c = range_consts(h, r);
  const Isa use = usable_isa(isa);
  return parallel_chunks(r.n, threads, [&](size_t begin, size_t end) {
    return run_range(c, adam_sub_range(r, begin, end), use);
  });
}

}  // namespace zoe

// Reference scalar Adam path, the float64 reference, and the ISA / thread dispatch.
#include <algorithm>
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

bool adam_undo_element(const AdamConsts& c, bool first_step, float grad, float& master, float& m, float& v) {
  float g = grad * c.grad_scale;
  if (!std::isfinite(g)) return false;
  // The step's own m / d, bit for bit: it came from the stepped m and v.
  const float denom = std::fma(std::sqrt(v), c.inv_sqrt_bc2, c.eps);
  const float p = std::fma(-c.neg_step_size, m / denom, master);  // master * decay before the step
  master = p / c.decay;
  if (c.l2 != 0.0f) g = std::fma(c.l2, master, g);
  if (first_step) {
    m = 0.0f;
    v = 0.0f;
    return true;
  }
  m = (m - c.one_minus_beta1 * g) / c.beta1;
  v = std::max(0.0f, (v - (c.one_minus_beta2 * g) * g) / c.beta2);  // a square's average: never below 0
  return true;
}

// The speculative step that h takes back (see AdamHyper::undo), over elements [0, n) of r;
// returns the lanes that step skipped. Every lane's weight copy is written (see adam.h).
static size_t undo_range(const AdamConsts& c, bool first_step, const AdamRange& r) {
  size_t skipped = 0;
  for (size_t i = 0; i < r.n; ++i) {
    const float g = load_as_f32(r.grad, r.grad_dtype, i);
    skipped += !adam_undo_element(c, first_step, g, r.master[i], r.exp_avg[i], r.exp_avg_sq[i]);
    if (r.param_out) store_from_f32(r.param_out, r.param_dtype, i, r.master[i]);
  }
  return skipped;
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

// The constants of range r: weight decay only where the range takes it.
static AdamConsts range_consts(AdamHyper h, const AdamRange& r) {
  if (!r.decay) h.weight_decay = 0.0;
  return adam_consts(h);
}

// What one call does to a range: the step, after taking back a speculative one (h.undo).
struct RangeWork {
  AdamConsts step;
  AdamConsts undo;  // with h.undo
  bool take_back, first_step, restore_only;
};

static RangeWork range_work(const AdamHyper& h, const AdamRange& r) {
  RangeWork w;
  w.step = range_consts(h, r);
  w.take_back = h.undo;
  w.first_step = h.step <= 1;
  w.restore_only = h.undo && h.restore_only;
  if (h.undo) {
    AdamHyper made = h;
    made.grad_scale = h.undo_grad_scale;
    w.undo = range_consts(made, r);
  }
  return w;
}

static size_t run_range(const RangeWork& w, const AdamRange& r, Isa isa) {
  if (w.take_back) {
    const size_t skipped = undo_range(w.undo, w.first_step, r);
    if (w.restore_only) return skipped;
  }
  switch (isa) {
    case Isa::kAvx512: return adam_range_avx512(w.step, r, isa_has_avx512bf16());
    case Isa::kAvx2: return adam_range_avx2(w.step, r);
    default: return adam_range_scalar(w.step, r);
  }
}

size_t adam_step_range(const AdamHyper& h, const AdamRange& r, Isa isa) {
  if (r.n == 0) return 0;
  return run_range(range_work(h, r), r, usable_isa(isa));
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
  const RangeWork w = range_work(h, r);
  const Isa use = usable_isa(isa);
  return parallel_chunks(r.n, threads, [&](size_t begin, size_t end) {
    return run_range(w, adam_sub_range(r, begin, end), use);
  });
}

}  // namespace zoe

#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zoe {

namespace {

// DeepSpeed's engine builds its scheduler at iteration -1 and steps it after each optimizer step,
// so optimizer step s (0-based) runs with the lr of scheduler iteration s - 1. zoe gives the same
// sequence: iteration -1 gives WarmupLR's min lr and WarmupCosineLR's ratio 0.
int64_t ds_iteration(int64_t step) { return step - 1; }

// Warm-up progress in [0, 1) at iteration it >= 0: log(it+1)/log(W) or it/W, with DeepSpeed's
// W = max(2, warmup_num_steps).
double warmup_gamma(const Config& c, int64_t it) {
  int64_t w = std::max<int64_t>(2, c.warmup_num_steps);
  if (it >= w) return 1.0;
  if (c.warmup_type == "linear") return static_cast<double>(it) / static_cast<double>(w);
  return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(w));
}

double cosine_ratio(const Config& c, int64_t it) {
  int64_t w = std::max<int64_t>(2, c.warmup_num_steps);
  if (it < 0) return 0.0;
  if (it < w) return c.warmup_min_ratio + (1.0 - c.warmup_min_ratio) * warmup_gamma(c, it);
  // Progress clamped to [0, 1]: past the end the ratio stays at cos_min_ratio.
  double span = static_cast<double>(std::max<int64_t>(1, c.total_num_steps - w));
  double progress = std::min(1.0, static_cast<double>(it - w + 1) / span);
  double cosv = (1.0 + std::cos(M_PI * progress)) / 2.0;
  return std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosv);
}

}  // namespace

double lr_at(const Config& c, int64_t step) {
  int64_t it = ds_iteration(step);
  if (c.scheduler == "WarmupLR")
    return it < 0 ? c.warmup_min_lr : c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * warmup_gamma(c, it);
  if (c.scheduler == "WarmupCosineLR") return c.lr * cosine_ratio(c, it);
  return c.lr;
}

}  // namespace zoe

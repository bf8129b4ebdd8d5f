#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zoe {

namespace {
// Warm-up progress in [0, 1]: log(step+1)/log(W) or step/W, as DeepSpeed computes it.
double warmup_gamma(const Config& c, int64_t step) {
  if (c.warmup_num_steps <= 1 || step >= c.warmup_num_steps) return 1.0;
  if (c.warmup_type == "linear") return static_cast<double>(step) / c.warmup_num_steps;
  return std::log(static_cast<double>(step + 1)) / std::log(static_cast<double>(c.warmup_num_steps));
}
}  // namespace

double lr_at(const Config& c, int64_t step) {
  if (c.scheduler == "WarmupLR") return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * warmup_gamma(c, step);
  if (c.scheduler == "WarmupCosineLR") {
    double ratio;
    if (step < c.warmup_num_steps) {
      ratio = c.warmup_min_ratio + (1.0 - c.warmup_min_ratio) * warmup_gamma(c, step);
    } else {
      double span = std::max<int64_t>(1, c.total_num_steps - c.warmup_num_steps);
      double cosv = (1.0 + std::cos(M_PI * static_cast<double>(step - c.warmup_num_steps) / span)) / 2.0;
      ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosv);
    }
    return c.lr * ratio;
  }
  return c.lr;
}

}  // namespace zoe

#include "sched/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace zoe {

LossScaler LossScaler::dynamic(int initial_power, int window, int hysteresis, double min_scale) {
  return LossScaler(std::ldexp(1.0, initial_power), true, window, hysteresis, min_scale);
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (hysteresis_left_ <= 1) scale_ = std::max(scale_ / 2, min_scale_);
    else --hysteresis_left_;
    good_steps_ = 0;
    return;
  }
  ++good_steps_;
  if (good_steps_ % window_ == 0) {
    scale_ *= 2;
    hysteresis_left_ = hysteresis_;
  }
}

void LossScaler::restore(double scale, int64_t good_steps, int hysteresis_left) {
  scale_ = scale;
  good_steps_ = good_steps;
  hysteresis_left_ = hysteresis_left;
}

}  // namespace zoe

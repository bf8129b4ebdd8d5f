// fp16 loss scaling with DeepSpeed's DynamicLossScaler rules: on overflow skip the step and
// halve the scale once `hysteresis` overflows have been absorbed; after `window` clean steps in
// a row, double it. A static scale (fp16.loss_scale > 0) or bf16/fp32 training never changes.
#pragma once
#include <cstdint>

namespace zoe {

class LossScaler {
 public:
  static LossScaler fixed(double scale) { return LossScaler(scale, false, 1, 1, 1.0); }
  static LossScaler dynamic(int initial_power, int window, int hysteresis, double min_scale);

  double scale() const { return scale_; }
  // Records the outcome of one step.
  void update(bool overflow);
  int64_t good_steps() const { return good_steps_; }
  int hysteresis_left() const { return hysteresis_left_; }
  void restore(double scale, int64_t good_steps, int hysteresis_left);

 private:
  LossScaler(double scale, bool dynamic, int window, int hysteresis, double min_scale)
      : scale_(scale), dynamic_(dynamic), window_(window), hysteresis_(hysteresis),
        hysteresis_left_(hysteresis), min_scale_(min_scale) {}
  double scale_;
  bool dynamic_;
  int window_, hysteresis_, hysteresis_left_;
  double min_scale_;
  int64_t good_steps_ = 0;
};

}  // namespace zoe

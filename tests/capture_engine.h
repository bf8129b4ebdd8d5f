// An Engine that keeps full fp32 parameters and records gradients: lets a model's backward be
// checked (against finite differences, or against PyTorch) without any sharding in the way.
#pragma once
#include <algorithm>
#include <utility>
#include <vector>

#include "zoe/engine.h"

namespace zoe::test {

class CaptureEngine final : public Engine {
 public:
  explicit CaptureEngine(std::vector<UnitSpec> u) : units_(std::move(u)) {
    for (auto& s : units_) params_.emplace_back(s.numel), grads_.emplace_back(s.numel);
  }
  int num_units() const override { return static_cast<int>(units_.size()); }
  const UnitSpec& unit(int u) const override { return units_[u]; }
  int64_t params() const override { return 0; }
  Status set_params(int u, const float* v) override {
    std::copy(v, v + units_[u].numel, params_[u].begin());
    return Status::Ok();
  }
  Result<ParamView> fetch(int u) override { return ParamView{params_[u].data(), DType::kF32, units_[u].numel}; }
  Status release(int) override { return Status::Ok(); }
  Status grads_ready(int u, const float* g) override {
    std::copy(g, g + units_[u].numel, grads_[u].begin());
    return Status::Ok();
  }
  Result<StepResult> step(double) override { return StepResult{}; }
  void set_activation_bytes(uint64_t) override {}
  double loss_scale() const override { return 1; }
  int64_t steps_applied() const override { return 0; }
  OwnedRange owned_range(int) const override { return {}; }
  Status read_owned(int, OwnedKind, int64_t, int64_t, float*) override { return Status::Ok(); }
  Status write_owned(int, OwnedKind, int64_t, int64_t, const float*) override { return Status::Ok(); }
  Status commit_owned_state() override { return Status::Ok(); }
  void restore_counters(int64_t, double, int64_t, int) override {}
  void scaler_state(int64_t*, int*) const override {}
  std::vector<std::vector<float>> params_, grads_;

 private:
  std::vector<UnitSpec> units_;
};

}  // namespace zoe::test

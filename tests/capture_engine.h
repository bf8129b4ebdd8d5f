// An Engine that keeps full fp32 parameters and records gradients: lets a model's backward be
// checked (against finite differences, or against PyTorch) without any sharding in the way. Its
// device is a strict CPU device, so the model is checked to compute in device memory too.
#pragma once
#include <algorithm>
#include <utility>
#include <vector>

#include "cpu/cpu_device.h"
#include "zoe/engine.h"

namespace zoe::test {

class CaptureEngine final : public Engine {
 public:
  // The model runs on a strict CPU device: every buffer it touches must be device memory.
  explicit CaptureEngine(std::vector<UnitSpec> u, size_t device_budget = size_t{1} << 30)
      : dev_(device_budget, size_t{1} << 30, /*strict=*/true), units_(std::move(u)) {
    for (auto& s : units_) {
      params_.emplace_back(s.numel), grads_.emplace_back(s.numel);
      dev_params_.push_back(dev_.alloc(s.numel * 4, Tier::kDevice, Kind::kParam).value());
    }
  }
  ~CaptureEngine() override {
    for (Buffer& b : dev_params_) dev_.free(b);
  }
  Device& device() override { return dev_; }
  int num_units() const override { return static_cast<int>(units_.size()); }
  const UnitSpec& unit(int u) const override { return units_[u]; }
  int64_t params() const override { return 0; }
  Status set_params(int u, const float* v) override {
    std::copy(v, v + units_[u].numel, params_[u].begin());
    return dev_.upload(dev_params_[u].data, v, units_[u].numel * 4);
  }
  Result<ParamView> fetch(int u) override { return ParamView{dev_params_[u].data, DType::kF32, units_[u].numel}; }
  Status release(int) override { return Status::Ok(); }
  Status grads_ready(int u, const float* g) override { return dev_.download(grads_[u].data(), g, units_[u].numel * 4); }
  Result<StepResult> step(double) override { return StepResult{}; }
  Status update_during_backward(double) override { return Status::Ok(); }
  Result<StepResult> flush() override { return StepResult{}; }
  void require_matching_grads(bool) override {}
  void set_activation_bytes(uint64_t) override {}
  double loss_scale() const override { return 1; }
  int64_t steps_applied() const override { return 0; }
  OwnedRange owned_range(int) const override { return {}; }
  Status read_owned(int, OwnedKind, int64_t, int64_t, float*) override { return Status::Ok(); }
  Status write_owned(int, OwnedKind, int64_t, int64_t, const float*) override { return Status::Ok(); }
  Status commit_owned_state() override { return Status::Ok(); }
  NvmeBytes nvme_bytes() const override { return {}; }
  void wait_nvme_idle() override {}
  std::vector<std::vector<float>> params_, grads_;  // host copies: what was set, what was handed over

 private:
  CpuDevice dev_;
  std::vector<UnitSpec> units_;
  std::vector<Buffer> dev_params_;
};

}  // namespace zoe::test

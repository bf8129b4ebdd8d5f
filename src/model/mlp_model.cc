#include "model/mlp_model.h"

#include <cblas.h>

#include <cmath>

#include <fmt/format.h>

#include "common/profiler.h"
#include "common/rng.h"

namespace zoe {

MlpModel::MlpModel(int n_layer, int width, uint64_t data_seed) : L_(n_layer), D_(width), data_seed_(data_seed) {}

std::vector<UnitSpec> MlpModel::units() const {
  std::vector<UnitSpec> u;
  for (int l = 0; l < L_; ++l)
    u.push_back(make_unit(fmt::format("layers.{}", l), {{fmt::format("layers.{}.weight", l), {D_, D_}},
                                                        {fmt::format("layers.{}.bias", l), {D_}},
                                                        {fmt::format("layers.{}.gain", l), {1}}}));
  return u;
}

void MlpModel::init_unit(int u, uint64_t seed, float* out) const {
  // Weights ~ N(0, 1/D) keep activations O(1) through tanh; biases small but non-zero so their
  // gradients and updates are exercised too.
  double std = 1.0 / std::sqrt(static_cast<double>(D_));
  for (int64_t i = 0; i < int64_t{D_} * D_; ++i) out[i] = static_cast<float>(std * counter_normal(seed, u, i));
  for (int i = 0; i < D_; ++i) out[int64_t{D_} * D_ + i] = static_cast<float>(0.01 * counter_normal(seed, u + 1000003, i));
  out[int64_t{D_} * D_ + D_] = 1.0f;
}

void MlpModel::sample(int64_t s, float* x, float* y) const {
  for (int j = 0; j < D_; ++j) x[j] = static_cast<float>(2.0 * counter_uniform(data_seed_, s, j) - 1.0);
  for (int j = 0; j < D_; ++j) y[j] = std::tanh(x[(j + 1) % D_] - 0.5f * x[j]) * 0.5f;
}

Status MlpModel::forward(Engine& e, const Batch& b, std::vector<std::vector<float>>& acts) {
  acts.assign(L_ + 1, std::vector<float>(size_t(b.B) * D_));
  std::vector<float> y(D_), w(size_t(D_) * D_ + D_ + 1);
  for (int i = 0; i < b.B; ++i) sample(b.first_sample + i, &acts[0][size_t(i) * D_], y.data());
  for (int l = 0; l < L_; ++l) {
    ZOE_RETURN_IF_ERROR(fetch_to_host(e, l, w.data()));
    ZOE_SPAN("forward " + std::to_string(l), "compute", Bucket::kForward);
    float* out = acts[l + 1].data();
    const float* bias = w.data() + size_t(D_) * D_;
    float gain = bias[D_];
    for (int i = 0; i < b.B; ++i) std::copy(bias, bias + D_, out + size_t(i) * D_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b.B, D_, D_, 1.0f, acts[l].data(), D_, w.data(), D_, 1.0f,
                out, D_);
    for (auto& v : acts[l + 1]) v = l + 1 < L_ ? std::tanh(gain * v) : gain * v;
  }
  return Status::Ok();
}

double MlpModel::loss_and_grad(const Batch& b, const std::vector<float>& out, float scale, std::vector<float>* dout) const {
  // loss = mean over samples of 0.5 * mean_j (out - y)^2
  std::vector<float> x(D_), y(D_);
  double loss = 0;
  if (dout) dout->assign(out.size(), 0.f);
  for (int i = 0; i < b.B; ++i) {
    sample(b.first_sample + i, x.data(), y.data());
    for (int j = 0; j < D_; ++j) {
      double d = double(out[size_t(i) * D_ + j]) - y[j];
      loss += 0.5 * d * d;
      if (dout) (*dout)[size_t(i) * D_ + j] = static_cast<float>(d * scale / (double(b.B) * D_));
    }
  }
  return loss / (double(b.B) * D_);
}

Result<double> MlpModel::train_micro_step(Engine& e, const Batch& b, float loss_scale) {
  std::vector<std::vector<float>> acts;
  ZOE_RETURN_IF_ERROR(forward(e, b, acts));
  std::vector<float> dout, din(size_t(b.B) * D_), w(size_t(D_) * D_ + D_ + 1), grad(size_t(D_) * D_ + D_ + 1);
  double loss = loss_and_grad(b, acts[L_], loss_scale, &dout);
  for (int l = L_ - 1; l >= 0; --l) {
    if (l + 1 < L_)  // through tanh: d/du tanh(u) = 1 - tanh^2
      for (size_t k = 0; k < dout.size(); ++k) dout[k] *= 1.0f - acts[l + 1][k] * acts[l + 1][k];
    ZOE_RETURN_IF_ERROR(fetch_to_host(e, l, w.data()));
    {
      ZOE_SPAN("backward " + std::to_string(l), "compute", Bucket::kBackward);
      // y = g*z with z = xW + b: dg = sum(dy*z), dz = g*dy; then dW = x^T dz, db = sum_i dz_i, dx = dz W^T
      const float* bias = w.data() + size_t(D_) * D_;
      float gain = bias[D_];
      double dg = 0;
      std::vector<float> z(size_t(b.B) * D_);
      for (int i = 0; i < b.B; ++i) std::copy(bias, bias + D_, z.begin() + size_t(i) * D_);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b.B, D_, D_, 1.0f, acts[l].data(), D_, w.data(), D_, 1.0f,
                  z.data(), D_);
      for (size_t k = 0; k < z.size(); ++k) {
        dg += double(dout[k]) * z[k];
        dout[k] *= gain;
      }
      grad[size_t(D_) * D_ + D_] = static_cast<float>(dg);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D_, D_, b.B, 1.0f, acts[l].data(), D_, dout.data(), D_, 0.0f,
                  grad.data(), D_);
      for (int j = 0; j < D_; ++j) {
        float s = 0;
        for (int i = 0; i < b.B; ++i) s += dout[size_t(i) * D_ + j];
        grad[size_t(D_) * D_ + j] = s;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b.B, D_, D_, 1.0f, dout.data(), D_, w.data(), D_, 0.0f,
                  din.data(), D_);
    }
    ZOE_RETURN_IF_ERROR(grads_from_host(e, l, grad.data()));
    std::swap(dout, din);
  }
  return loss;
}

Result<double> MlpModel::eval_loss(Engine& e, const Batch& b) {
  std::vector<std::vector<float>> acts;
  ZOE_RETURN_IF_ERROR(forward(e, b, acts));
  return loss_and_grad(b, acts[L_], 1.0f, nullptr);
}

}  // namespace zoe

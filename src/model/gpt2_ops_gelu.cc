// GELU, tanh approximation (GPT-2's "gelu_new").
#include <cmath>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"

namespace zoe::gpt2 {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;
constexpr int64_t kGrain = 16384;
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t N) {
  detail::parallel_range(N, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
      float x = inp[i];
      out[i] = 0.5f * x * (1.f + std::tanh(kGeluScale * (x + kGeluCube * x * x * x)));
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N) {
  detail::parallel_range(N, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
      float x = inp[i];
      float th = std::tanh(kGeluScale * (x + kGeluCube * x * x * x));
      // d/dx tanh(u) = 1 - tanh^2(u); written this way it cannot overflow as cosh would.
      float dth = (1.f - th * th) * kGeluScale * (1.f + 3.f * kGeluCube * x * x);
      dinp[i] += (0.5f * (1.f + th) + 0.5f * x * dth) * dout[i];
    }
  });
}

}  // namespace zoe::gpt2

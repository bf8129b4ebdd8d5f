// Residual connections: elementwise sum forward, gradient copied to both branches backward.
#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {

namespace {
constexpr int64_t kResidualGrain = 32768;
}

void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N) {
  detail::parallel_range(N, kResidualGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) out[i] = inp1[i] + inp2[i];
  });
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t N) {
  detail::parallel_range(N, kResidualGrain, [&](int64_t i0, int64_t i1) {
    if (dinp1)
      for (int64_t i = i0; i < i1; i++) dinp1[i] += dout[i];
    if (dinp2)
      for (int64_t i = i0; i < i1; i++) dinp2[i] += dout[i];
  });
}

}  // namespace zoe::gpt2

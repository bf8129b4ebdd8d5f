// Fused softmax + cross-entropy over the vocabulary.
#include <cmath>
#include <vector>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {

// One position: returns its loss; writes (softmax - onehot) * dscale into d when non-null.
// d may alias l: each element is read before it is written.
ZOE_SIMD_CLONES static double crossentropy_row(float* d, const float* l, int32_t target, int V,
                                               float dscale) {
  const float maxv = detail::max_of(l, V);
  const float lt = l[target];
  // With d, the exps are kept in d for the gradient pass: one exp per logit, not two.
  const double sum = detail::exp_shift_sum(d, l, maxv, V);
  if (d) {
    const float k = static_cast<float>(dscale / sum);
    for (int v = 0; v < V; v++) d[v] *= k;
    d[target] -= dscale;
  }
  return std::log(sum) + maxv - lt;
}

// In row order: the mean is the same for any thread count (0 for no rows).
static float mean_of(const std::vector<double>& row_loss) {
  double total = 0.0;
  for (double l : row_loss) total += l;
  return row_loss.empty() ? 0.f : static_cast<float>(total / static_cast<double>(row_loss.size()));
}

float crossentropy_forward_backward(float* dlogits, float* losses, const float* logits,
                                    const int32_t* targets, int N, int V, float dscale) {
  std::vector<double> row_loss(N);
  detail::parallel_range(N, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      float* d = dlogits ? dlogits + r * V : nullptr;
      row_loss[r] = crossentropy_row(d, logits + r * V, targets[r], V, dscale);
      if (losses) losses[r] = static_cast<float>(row_loss[r]);
    }
  });
  return mean_of(row_loss);
}

void crossentropy(float* loss, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                  float dscale) {
  *loss = crossentropy_forward_backward(dlogits, nullptr, logits, targets, N, V, dscale);
}

// Each row widened into a buffer of the task's, the fp32 row's loss and gradient computed there
// (the same function: bitwise crossentropy's on the widened logits), the gradient then rounded.
void crossentropy_bf16(float* loss, uint16_t* dlogits, const uint16_t* logits, const int32_t* targets, int N, int V,
                       float dscale) {
  std::vector<double> row_loss(N);
  detail::parallel_range(N, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(V);
    for (int64_t r = r0; r < r1; r++) {
      detail::widen_range(row.data(), logits + r * V, V);
      row_loss[r] = crossentropy_row(dlogits ? row.data() : nullptr, row.data(), targets[r], V, dscale);
      if (dlogits) detail::round_range(dlogits + r * V, row.data(), V);
    }
  });
  *loss = mean_of(row_loss);
}

}  // namespace zoe::gpt2

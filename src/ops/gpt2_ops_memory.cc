// Zeroing and copying buffers: the ops a model uses to clear gradients and keep activations.
#include <algorithm>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {

namespace {
constexpr int64_t kMemoryGrain = 32768;
}

void zero(float* x, int64_t n) {
  detail::parallel_range(n, kMemoryGrain, [&](int64_t a, int64_t b) { std::fill(x + a, x + b, 0.f); });
}

void copy(float* dst, const float* src, int64_t n) {
  detail::parallel_range(n, kMemoryGrain, [&](int64_t a, int64_t b) { std::copy(src + a, src + b, dst + a); });
}

}  // namespace zoe::gpt2

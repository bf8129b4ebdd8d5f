// What the two files of CudaModelOps (cuda_model_ops.cu: products, elementwise, losses;
// cuda_model_ops_attention.cu: the attention) share: launch sizes and shapes in messages.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace zoe::gpu {

// Blocks for a grid-stride loop over n > 0 items: enough to fill any GPU, few enough that each
// thread does several items of a large tensor.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 16));
}

// "what(d0, d1, ...)".
inline std::string shape_text(const char* what, std::initializer_list<int64_t> dims) {
  std::string s = what;
  s += "(";
  bool first = true;
  for (int64_t d : dims) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + ")";
}

}  // namespace zoe::gpu

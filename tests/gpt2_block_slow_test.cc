// Speed of one GPT-2 block on the CPU: B=4, T=256, C=384, NH=6, forward + backward.
// The bound is loose (the machine may be shared); the measured time is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "model/gpt2_block.h"
#include "model/gpt2_config.h"
#include "test_util.h"

namespace zoe::gpt2 {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Gpt2BlockSpeed, B4T256C384) {
  const BlockDims d{4, 256, 384, 6};
  const int64_t BTC = int64_t{d.B} * d.T * d.C;
  const Gpt2Shape s{1, d.NH, d.C, 64, d.T};
  std::vector<float> params(block_numel(d.C)), grads(params.size(), 0.f);
  init_unit(s, 1, 7, params.data());
  auto inp = test::random_floats(BTC, 1), dout = test::random_floats(BTC, 2, -1e-3f, 1e-3f);
  std::vector<float> out(BTC), dinp(BTC);
  BlockBuffers buf(d);
  double best_fwd = 1e9, best_bwd = 1e9, best_rec = 1e9;
  for (int rep = 0; rep < 4; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    block_forward(host_model_ops(), out.data(), buf.acts, params.data(), inp.data(), d);
    best_fwd = std::min(best_fwd, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    block_backward(host_model_ops(), dinp.data(), grads.data(), dout.data(), buf.acts, params.data(), inp.data(), d,
                   buf.scratch.data(), false);
    best_bwd = std::min(best_bwd, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    block_backward(host_model_ops(), dinp.data(), grads.data(), dout.data(), buf.acts, params.data(), inp.data(), d,
                   buf.scratch.data(), true);
    best_rec = std::min(best_rec, seconds_since(t0));
  }
  std::printf("block B4 T256 C384 NH6: forward %.1f ms, backward %.1f ms, "
              "backward with recompute %.1f ms\n",
              best_fwd * 1e3, best_bwd * 1e3, best_rec * 1e3);
  for (float x : dinp) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LT(best_fwd + best_bwd, 1.0);
}

}  // namespace
}  // namespace zoe::gpt2

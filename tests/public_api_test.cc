// The public API as a model sees it: public_api_model.cc, built with include/ alone on its path,
// trains through a real engine (stage 3 and stage 0 on the CPU device), and Adam's first step
// moves each weight by lr * sign(w).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/config.h"
#include "comm/comm.h"
#include "cpu/cpu_device.h"
#include "public_api_model.h"
#include "sched/zero_engine.h"
#include "train/engine_options.h"

namespace zoe::test {
namespace {

class PublicApi : public ::testing::TestWithParam<int> {};

TEST_P(PublicApi, AModelOnTheHeadersAloneTrainsThroughTheEngine) {
  Config c;
  c.stage = GetParam();
  c.weight_decay = 0;
  CpuDevice dev(1 << 20, 1 << 20, /*strict=*/true);
  auto comm = make_self_comm();
  auto made = ZeroEngine::create(engine_options(c), dev, *comm, public_api::quadratic_units(6));
  ASSERT_TRUE(made.ok()) << made.status().message();
  Engine& e = **made;
  const std::vector<float> w0 = {0.5f, -1.f, 2.f, -0.25f, 1.5f, -3.f};
  ASSERT_TRUE(e.set_params(0, w0.data()).ok());

  const double lr = 0.1;
  auto loss0 = public_api::quadratic_step(e, lr);
  ASSERT_TRUE(loss0.ok()) << loss0.status().message();
  double expect = 0;
  for (float x : w0) expect += 0.5 * x * x;
  EXPECT_NEAR(*loss0, expect, 1e-9);

  std::vector<float> w1(w0.size());
  ASSERT_TRUE(e.read_owned(0, OwnedKind::kMaster, 0, 6, w1.data()).ok());
  for (size_t i = 0; i < w0.size(); ++i)  // m = g, v = g^2 after bias correction: a step of lr
    EXPECT_NEAR(w1[i], w0[i] - lr * w0[i] / (std::fabs(w0[i]) + 1e-8), 1e-6) << i;

  double last = *loss0;
  for (int s = 0; s < 4; ++s) {
    auto loss = public_api::quadratic_step(e, lr);
    ASSERT_TRUE(loss.ok()) << loss.status().message();
    EXPECT_LT(*loss, last);
    last = *loss;
  }
  EXPECT_EQ(e.steps_applied(), 5);
}

INSTANTIATE_TEST_SUITE_P(Stages, PublicApi, ::testing::Values(0, 3));

}  // namespace
}  // namespace zoe::test

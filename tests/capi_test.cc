// The C API on one rank, through zoe/zoe.h and libzoe.so only: misuse of every kind returns an
// error code with a message naming the problem and leaves the engine usable; save, load, export
// and a safetensors start round-trip; calls from another thread work.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dl_read.h"
#include "test_util.h"
#include "zoe/zoe.h"

namespace {

constexpr int64_t kD = 4;
const DLDataType kF32{kDLFloat, 32, 1};

DLTensor host_tensor(void* data, std::vector<int64_t>& shape, DLDataType dt = kF32, int64_t* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dt;
  t.shape = shape.data();
  t.strides = strides;
  return t;
}

std::string config(int stage) {
  return zoe::test::on_test_device("{\"zero_optimization\": {\"stage\": " + std::to_string(stage) +
                        "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}");
}

// Two units "a" and "b", each w [4,4] + bias [4].
zoe_engine* two_units(int stage, bool start = true) {
  zoe_engine* e = nullptr;
  EXPECT_EQ(zoe_engine_new(config(stage).c_str(), &e), ZOE_OK) << zoe_last_error();
  int64_t w[2] = {kD, kD}, b[1] = {kD};
  for (const char* u : {"a", "b"}) {
    EXPECT_EQ(zoe_register_param(e, u, (std::string(u) + ".w").c_str(), 2, w, kF32, 1), ZOE_OK) << zoe_last_error();
    EXPECT_EQ(zoe_register_param(e, u, (std::string(u) + ".bias").c_str(), 1, b, kF32, 0), ZOE_OK);
  }
  if (start) {
    EXPECT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
  }
  return e;
}

// Asserts code and that the message contains `needle`.
void expect_error(zoe_status got, zoe_status want, const std::string& needle) {
  EXPECT_EQ(got, want) << zoe_last_error();
  EXPECT_NE(std::string(zoe_last_error()).find(needle), std::string::npos)
      << "message '" << zoe_last_error() << "' lacks '" << needle << "'";
}

std::vector<float> fetch_copy(zoe_engine* e, int u) {
  DLManagedTensor* t = nullptr;
  EXPECT_EQ(zoe_fetch(e, u, &t), ZOE_OK) << zoe_last_error();
  if (!t) return {};
  std::vector<float> v = zoe::test::read_floats(t->dl_tensor, t->dl_tensor.shape[0]);
  t->deleter(t);
  EXPECT_EQ(zoe_release(e, u), ZOE_OK);
  return v;
}

void hand_over_ones(zoe_engine* e, int u) {
  std::vector<float> g(kD * kD + kD, 1.0f);
  std::vector<int64_t> shape{static_cast<int64_t>(g.size())};
  DLTensor t = host_tensor(g.data(), shape);
  ASSERT_EQ(zoe_grads_ready(e, u, &t), ZOE_OK) << zoe_last_error();
}

// zoe.update_in_backward through the C API: the weights of the update after the backward, bit for
// bit; another lr at zoe_step is an error naming the announced one, and the engine goes on.
TEST(CApi, UpdateDuringTheBackwardGivesTheWeightsOfTheUpdateAfterIt) {
  std::vector<float> weights[2];
  for (int during : {0, 1}) {
    zoe_engine* e = nullptr;
    std::string cfg = zoe::test::on_test_device(
        R"({"zero_optimization": {"stage": 3}, "gradient_clipping": 0,)"
        R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zoe": {"update_in_backward": true}})");
    ASSERT_EQ(zoe_engine_new(cfg.c_str(), &e), ZOE_OK) << zoe_last_error();
    int64_t w[2] = {kD, kD}, b[1] = {kD};
    for (const char* u : {"a", "b"}) {
      ASSERT_EQ(zoe_register_param(e, u, (std::string(u) + ".w").c_str(), 2, w, kF32, 1), ZOE_OK) << zoe_last_error();
      ASSERT_EQ(zoe_register_param(e, u, (std::string(u) + ".bias").c_str(), 1, b, kF32, 0), ZOE_OK);
    }
    ASSERT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
    for (int step = 0; step < 3; ++step) {
      if (during) {
        ASSERT_EQ(zoe_update_during_backward(e, -1), ZOE_OK) << zoe_last_error();
      }
      hand_over_ones(e, 1);
      hand_over_ones(e, 0);
      ASSERT_EQ(zoe_step(e, -1, nullptr), ZOE_OK) << zoe_last_error();
    }
    for (int u : {0, 1})
      for (float v : fetch_copy(e, u)) weights[during].push_back(v);
    if (during) {  // the units already stepped stay so: after the comparison's weights
      ASSERT_EQ(zoe_update_during_backward(e, 0.5), ZOE_OK) << zoe_last_error();
      hand_over_ones(e, 1);
      expect_error(zoe_step(e, 0.25, nullptr), ZOE_ERR_INVALID, "announced lr 0.5");
      hand_over_ones(e, 1);
      hand_over_ones(e, 0);
      EXPECT_EQ(zoe_step(e, -1, nullptr), ZOE_OK) << zoe_last_error();
    }
    zoe_engine_free(e);
  }
  ASSERT_FALSE(weights[0].empty());
  EXPECT_EQ(weights[0], weights[1]);
}

TEST(CApi, BadConfigAndNullPointers) {
  zoe_engine* e = reinterpret_cast<zoe_engine*>(0x1);
  expect_error(zoe_engine_new(nullptr, &e), ZOE_ERR_INVALID, "config_json");
  EXPECT_EQ(e, nullptr);
  expect_error(zoe_engine_new("{\"zero_optimization\": {\"stag\": 3}}", &e), ZOE_ERR_INVALID, "stage");
  expect_error(zoe_engine_new("{not json", &e), ZOE_ERR_INVALID, "config");
  expect_error(zoe_engine_new("{}", nullptr), ZOE_ERR_INVALID, "out");
  expect_error(zoe_start(nullptr), ZOE_ERR_INVALID, "null");
  expect_error(zoe_fetch(nullptr, 0, nullptr), ZOE_ERR_INVALID, "null");
  zoe_step_result r;
  expect_error(zoe_step(nullptr, 1e-3, &r), ZOE_ERR_INVALID, "null");
  zoe_engine_free(nullptr);  // a no-op
}

TEST(CApi, RegistrationMistakes) {
  zoe_engine* e = two_units(3, false);
  int64_t w[2] = {kD, kD}, zero[1] = {0};
  expect_error(zoe_register_param(e, "a", "a.w", 2, w, kF32, 1), ZOE_ERR_INVALID, "already registered");
  expect_error(zoe_register_param(e, "c", "c.w", 1, zero, kF32, 0), ZOE_ERR_INVALID, "dimension <= 0");
  expect_error(zoe_register_param(e, "c", "c.w", 2, nullptr, kF32, 0), ZOE_ERR_INVALID, "shape");
  expect_error(zoe_register_param(e, "c", "c.w", 2, w, DLDataType{kDLBfloat, 16, 1}, 0), ZOE_ERR_INVALID, "fp32");
  expect_error(zoe_register_param(e, "c", "c.w", 2, w, DLDataType{kDLInt, 32, 1}, 0), ZOE_ERR_INVALID, "int32");
  expect_error(zoe_register_param(e, nullptr, "c.w", 2, w, kF32, 0), ZOE_ERR_INVALID, "unit");
  expect_error(zoe_fetch(e, 0, nullptr), ZOE_ERR_INVALID, "out");
  DLManagedTensor* t = nullptr;
  expect_error(zoe_fetch(e, 0, &t), ZOE_ERR_RUNTIME, "not started");
  ASSERT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
  expect_error(zoe_start(e), ZOE_ERR_RUNTIME, "started already");
  expect_error(zoe_register_param(e, "c", "c.w", 2, w, kF32, 0), ZOE_ERR_RUNTIME, "before zoe_start");
  EXPECT_EQ(zoe_num_units(e), 2);
  EXPECT_EQ(zoe_num_params(e), 2 * (kD * kD + kD));
  EXPECT_EQ(zoe_unit_index(e, "b.bias"), 1);
  EXPECT_EQ(zoe_unit_index(e, "nope"), -1);
  int unit = -1;
  int64_t off = -1, n = -1;
  ASSERT_EQ(zoe_param_info(e, "b.bias", &unit, &off, &n), ZOE_OK);
  EXPECT_EQ(unit, 1);
  EXPECT_EQ(off, kD * kD);
  EXPECT_EQ(n, kD);
  zoe_engine_free(e);
}

// A shape whose element count overflows int64 (or passes what the engine can hold) is refused,
// never wrapped: [4, 2^62+1] wraps to 4 elements.
TEST(CApi, OverflowingParameterShapesAreRefused) {
  zoe_engine* e = two_units(3, false);
  const int64_t wraps[2] = {4, (int64_t{1} << 62) + 1}, huge[1] = {int64_t{1} << 60};
  expect_error(zoe_register_param(e, "c", "c.w", 2, wraps, kF32, 1), ZOE_ERR_INVALID, "dimension 1");
  EXPECT_NE(std::string(zoe_last_error()).find("'c.w'"), std::string::npos) << zoe_last_error();
  expect_error(zoe_register_param(e, "c", "c.w", 1, huge, kF32, 1), ZOE_ERR_INVALID, "dimension 0");
  // Each fits, the unit's sum would not.
  const int64_t half[1] = {int64_t{1} << 58};
  ASSERT_EQ(zoe_register_param(e, "big", "big.0", 1, half, kF32, 0), ZOE_OK) << zoe_last_error();
  expect_error(zoe_register_param(e, "big", "big.1", 1, half, kF32, 0), ZOE_ERR_INVALID, "unit 'big'");
  EXPECT_EQ(zoe_num_units(e), 3);
  EXPECT_EQ(zoe_num_params(e), 2 * (kD * kD + kD) + (int64_t{1} << 58));
  zoe_engine_free(e);  // never started: nothing of that size is allocated
}

// Gradients whose shape, strides, byte offset or ndim overflow or point outside their extent are
// refused before any copy, and the engine trains on.
TEST(CApi, OverflowingGradientTensorsAreRefused) {
  zoe_engine* e = two_units(3);
  std::vector<double> g64(kD * kD + kD, 1.0);
  // [2^62+5, 4] wraps to 20 elements, unit b's count: a float64 strided read of the wrapped count.
  std::vector<int64_t> wrapped{(int64_t{1} << 62) + 5, 4};
  int64_t compact[2] = {4, 1};
  DLTensor t = host_tensor(g64.data(), wrapped, DLDataType{kDLFloat, 64, 1}, compact);
  expect_error(zoe_grads_ready(e, 1, &t), ZOE_ERR_INVALID, "zoe_grads_ready 'b': gradient shape");
  // Stride 2^62 times 3 rows overflows (times 4 bytes, 2^62 wraps to the same address).
  std::vector<float> g(kD * kD, 1.0f);
  std::vector<int64_t> w{kD, kD};
  int64_t far[2] = {int64_t{1} << 62, 1};
  t = host_tensor(g.data(), w, kF32, far);
  expect_error(zoe_grad_param(e, "a.w", &t), ZOE_ERR_INVALID, "stride 0");
  // A byte offset that wraps the address space (to 8 bytes before the data).
  t = host_tensor(g.data(), w);
  t.byte_offset = ~uint64_t{0} - 7;
  expect_error(zoe_grad_param(e, "a.w", &t), ZOE_ERR_INVALID, "byte offset");
  int64_t backwards[2] = {-4, 1};
  t = host_tensor(g.data(), w, kF32, backwards);
  expect_error(zoe_grad_param(e, "a.w", &t), ZOE_ERR_INVALID, "negative");
  // ndim 2^20 (20 elements: [20, 1, 1, ...]): zoe reads at most 64 dimensions.
  std::vector<int64_t> many(1 << 20, 1);
  many[0] = kD * kD + kD;
  t = host_tensor(g64.data(), many);
  expect_error(zoe_grads_ready(e, 1, &t), ZOE_ERR_INVALID, "1048576 dimensions");
  hand_over_ones(e, 0);
  zoe_step_result r;
  ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(r.step, 1);
  zoe_engine_free(e);
}

// A byte_offset that takes a valid pointer far past any user address (2^62, well below the wrap of
// the address space) is refused before zoe reads there, for a gradient and an initial value.
TEST(CApi, ByteOffsetsPastTheUserAddressSpaceAreRefused) {
  zoe_engine* e = two_units(3);
  std::vector<float> g(kD * kD, 1.0f);
  std::vector<int64_t> w{kD, kD};
  DLTensor t = host_tensor(g.data(), w);
  t.byte_offset = uint64_t{1} << 62;
  expect_error(zoe_grad_param(e, "a.w", &t), ZOE_ERR_INVALID, "zoe_grad_param 'a.w': the gradient's data pointer");
  EXPECT_NE(std::string(zoe_last_error()).find("byte_offset (4611686018427387904)"), std::string::npos)
      << zoe_last_error();
  expect_error(zoe_set_param(e, "a.w", &t), ZOE_ERR_INVALID, "zoe_set_param 'a.w': the value's data pointer");
  std::vector<float> unit(kD * kD + kD, 1.0f);
  std::vector<int64_t> flat{kD * kD + kD};
  DLTensor whole = host_tensor(unit.data(), flat);
  whole.byte_offset = uint64_t{1} << 56;  // the bound itself: past it by the tensor's bytes
  expect_error(zoe_grads_ready(e, 1, &whole), ZOE_ERR_INVALID, "byte_offset");
  hand_over_ones(e, 0);
  zoe_step_result r;
  ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(r.step, 1);
  zoe_engine_free(e);
}

// Issue 45: under torchrun or accelerate launch (WORLD_SIZE > 1, no MPI) each process trained
// alone as a one-rank zoe, N replicas and no error. It is refused, saying how to launch.
TEST(CApi, SeveralProcessesLaunchedWithoutMpiAreRefused) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) GTEST_SKIP() << "under mpirun";
  const char* kConfig = "{\"zero_optimization\": {\"stage\": 0}}";
  setenv("WORLD_SIZE", "2", 1);
  zoe_engine* e = nullptr;
  EXPECT_EQ(zoe_engine_new(kConfig, &e), ZOE_ERR_INVALID);
  EXPECT_NE(std::string(zoe_last_error()).find("WORLD_SIZE=2"), std::string::npos) << zoe_last_error();
  EXPECT_NE(std::string(zoe_last_error()).find("mpirun -np 2"), std::string::npos) << zoe_last_error();
  setenv("WORLD_SIZE", "1", 1);  // one process: nothing to refuse
  EXPECT_EQ(zoe_engine_new(kConfig, &e), ZOE_OK) << zoe_last_error();
  zoe_engine_free(e);
  unsetenv("WORLD_SIZE");
}

// zoe_step while a unit is fetched and not released is refused (it is not waited for: the caller
// holds the unit), naming the units: an update would move the weights under the caller's view
// of them. Released, the same gradients step.
TEST(CApi, StepWhileUnitsAreHeldIsRefused) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    zoe_engine* e = two_units(stage);
    hand_over_ones(e, 0);
    hand_over_ones(e, 1);
    DLManagedTensor* b = nullptr;
    ASSERT_EQ(zoe_fetch(e, 1, &b), ZOE_OK) << zoe_last_error();
    const std::vector<float> before = zoe::test::read_floats(b->dl_tensor, b->dl_tensor.shape[0]);
    zoe_step_result r{};
    expect_error(zoe_step(e, 1e-2, &r), ZOE_ERR_RUNTIME,
                 "zoe_step: unit 1 ('b') is still held (fetched and not released); release it before stepping");
    DLManagedTensor* a = nullptr;
    ASSERT_EQ(zoe_fetch(e, 0, &a), ZOE_OK) << zoe_last_error();
    expect_error(zoe_step(e, 1e-2, &r), ZOE_ERR_RUNTIME, "2 units are still held (fetched and not released): "
                                                         "0 ('a'), 1 ('b'); release them");
    EXPECT_EQ(zoe::test::read_floats(b->dl_tensor, b->dl_tensor.shape[0]), before);
    a->deleter(a);
    b->deleter(b);
    ASSERT_EQ(zoe_release(e, 0), ZOE_OK) << zoe_last_error();
    ASSERT_EQ(zoe_release(e, 1), ZOE_OK) << zoe_last_error();
    ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
    EXPECT_EQ(r.step, 1);
    EXPECT_NEAR(fetch_copy(e, 1)[0], -0.01f, 1e-6);
    zoe_engine_free(e);
  }
}

// A run-time lr passes the config's own check of optimizer.params.lr (finite, in [0, 1e30]); a
// finite negative lr is the documented "the config's value". NaN, inf or 1e300 used to make every
// weight NaN.
TEST(CApi, RunTimeLearningRatesAreCheckedAsTheConfigChecksThem) {
  zoe_engine* e = two_units(3);
  hand_over_ones(e, 0);
  hand_over_ones(e, 1);
  zoe_step_result r{};
  expect_error(zoe_step(e, NAN, &r), ZOE_ERR_INVALID, "zoe_step: lr nan is not a learning rate");
  expect_error(zoe_step(e, INFINITY, &r), ZOE_ERR_INVALID, "zoe_step: lr inf is not");
  expect_error(zoe_step(e, -INFINITY, &r), ZOE_ERR_INVALID, "zoe_step: lr -inf is not");
  expect_error(zoe_step(e, 1e300, &r), ZOE_ERR_INVALID, "zoe_step: lr 1e+300 is not");
  EXPECT_NE(std::string(zoe_last_error()).find("[0, 1e+30]"), std::string::npos) << zoe_last_error();
  expect_error(zoe_update_during_backward(e, NAN), ZOE_ERR_INVALID, "zoe_update_during_backward: lr nan");
  ASSERT_EQ(zoe_step(e, 1e30, &r), ZOE_OK) << zoe_last_error();  // the config's upper bound is an lr
  EXPECT_EQ(r.lr, 1e30);
  for (float v : fetch_copy(e, 0)) EXPECT_TRUE(std::isfinite(v)) << v;
  hand_over_ones(e, 0);
  ASSERT_EQ(zoe_step(e, -1, &r), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(r.lr, 0.01);  // the config's
  EXPECT_EQ(r.step, 2);
  zoe_engine_free(e);
}

TEST(CApi, MisuseDuringTrainingLeavesTheEngineUsable) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    zoe_engine* e = two_units(stage);
    DLManagedTensor* t = nullptr;
    expect_error(zoe_fetch(e, 7, &t), ZOE_ERR_INVALID, "unit 7 does not exist");
    expect_error(zoe_fetch(e, -1, &t), ZOE_ERR_INVALID, "does not exist");
    expect_error(zoe_release(e, 0), ZOE_ERR_RUNTIME, "not fetched");
    zoe_step_result r;
    expect_error(zoe_step(e, 1e-3, &r), ZOE_ERR_RUNTIME, "before any gradient");
    std::vector<float> g(kD * kD, 1.0f);
    std::vector<int64_t> wrong{kD, kD + 1}, w{kD, kD}, flat{kD * kD + kD};
    DLTensor bad_shape = host_tensor(g.data(), wrong);
    expect_error(zoe_grad_param(e, "a.w", &bad_shape), ZOE_ERR_INVALID, "shape [4, 5], expected [4, 4]");
    DLTensor bad_dtype = host_tensor(g.data(), w, DLDataType{kDLInt, 32, 1});
    expect_error(zoe_grad_param(e, "a.w", &bad_dtype), ZOE_ERR_INVALID, "int32");
    DLTensor no_data = host_tensor(nullptr, w);
    expect_error(zoe_grad_param(e, "a.w", &no_data), ZOE_ERR_INVALID, "null pointer");
    expect_error(zoe_grad_param(e, "a.w", nullptr), ZOE_ERR_INVALID, "null pointer");
    DLTensor good = host_tensor(g.data(), w);
    expect_error(zoe_grad_param(e, "zz", &good), ZOE_ERR_INVALID, "no parameter named 'zz'");
    expect_error(zoe_grads_ready(e, 1, nullptr), ZOE_ERR_RUNTIME, "no gradient is staged");
    DLTensor short_flat = host_tensor(g.data(), w);
    expect_error(zoe_grads_ready(e, 1, &short_flat), ZOE_ERR_INVALID, "expected 20 elements");
    expect_error(zoe_grads_ready(e, 9, &short_flat), ZOE_ERR_INVALID, "unit 9");
    std::vector<float> init(kD * kD, 0.5f);
    DLTensor wrong_init = host_tensor(init.data(), wrong);
    expect_error(zoe_set_param(e, "a.w", &wrong_init), ZOE_ERR_INVALID, "shape");
    expect_error(zoe_load_safetensors(e, "/nonexistent/x.safetensors"), ZOE_ERR_INVALID, "/nonexistent/x.safetensors");
    // After all that, a real step: a.w staged (a.bias counts as zeros), b as one tensor.
    ASSERT_EQ(zoe_grad_param(e, "a.w", &good), ZOE_OK) << zoe_last_error();
    ASSERT_EQ(zoe_grads_ready(e, 0, nullptr), ZOE_OK) << zoe_last_error();
    hand_over_ones(e, 1);
    ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
    EXPECT_EQ(r.applied, 1);
    EXPECT_EQ(r.step, 1);
    // Adam's first step moves every weight with a gradient by -lr, and a.bias (zeros) not at all.
    std::vector<float> a = fetch_copy(e, 0), b = fetch_copy(e, 1);
    EXPECT_NEAR(a[0], -0.01f, 1e-6);
    EXPECT_EQ(a[kD * kD], 0.0f);
    EXPECT_NEAR(b[kD * kD], -0.01f, 1e-6);
    zoe_engine_free(e);
  }
}

TEST(CApi, AnyFloatDtypeAndStrides) {
  zoe_engine* e = two_units(3);
  std::vector<double> g64(kD * kD);
  for (int i = 0; i < kD * kD; ++i) g64[i] = i + 1;
  // a.w's gradient as the transpose of a float64 matrix: strides {1, 4}.
  std::vector<int64_t> w{kD, kD};
  int64_t strides[2] = {1, kD};
  DLTensor t = host_tensor(g64.data(), w, DLDataType{kDLFloat, 64, 1}, strides);
  ASSERT_EQ(zoe_grad_param(e, "a.w", &t), ZOE_OK) << zoe_last_error();
  std::vector<uint16_t> bf(kD, 0x3f80);  // bfloat16 1.0
  std::vector<int64_t> b{kD};
  DLTensor tb = host_tensor(bf.data(), b, DLDataType{kDLBfloat, 16, 1});
  ASSERT_EQ(zoe_grad_param(e, "a.bias", &tb), ZOE_OK) << zoe_last_error();
  zoe_step_result r;
  ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();  // the staged unit goes over here
  // The norm sees exactly the values handed over: sqrt(sum 1..16 squared + 4).
  double want = 0;
  for (int i = 1; i <= 16; ++i) want += double(i) * i;
  EXPECT_NEAR(r.grad_norm, std::sqrt(want + 4), 1e-4);
  zoe_engine_free(e);
}

#ifdef ZOE_CUDA_EMU
// The emulated runtime's (libzoe_emu): what a framework does on its own stream. cudaError_t and
// cudaMemcpyKind as int, streams as pointers.
extern "C" {
int cudaMalloc(void** p, size_t bytes);
int cudaFree(void* p);
int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream);
int cudaMemsetAsync(void* p, int value, size_t bytes, void* stream);
int cudaStreamSynchronize(void* stream);
}

// Two steps of both units on the emulated GPU, the caller's work on CUDA's default stream (as
// torch's): each fetched unit read there at once, a gradient written there, handed over (zoe's
// streams wait for it) and its memory overwritten there at once. With `set_stream`, nothing waits
// on the host: only events order the caller's stream after zoe's work; without, the calls wait.
// Returns the weights read.
std::vector<float> caller_stream_steps(bool set_stream) {
  constexpr int kN = kD * kD + kD;
  zoe_engine* e = two_units(3);
  if (set_stream) {
    EXPECT_EQ(zoe_set_stream(e, nullptr), ZOE_OK) << zoe_last_error();
  }
  void* g = nullptr;
  EXPECT_EQ(cudaMalloc(&g, kN * sizeof(float)), 0);
  std::vector<float> ones(kN, 1.0f), seen;
  std::vector<int64_t> shape{kN};
  DLTensor gt{};
  gt.data = g;
  gt.device = {kDLCUDA, 0};
  gt.ndim = 1;
  gt.dtype = kF32;
  gt.shape = shape.data();
  for (int step = 0; step < 2; ++step) {
    for (int u = 0; u < 2; ++u) {
      DLManagedTensor* t = nullptr;
      EXPECT_EQ(zoe_fetch(e, u, &t), ZOE_OK) << zoe_last_error();
      if (!t) break;
      std::vector<float> w(kN);
      EXPECT_EQ(cudaMemcpyAsync(w.data(), t->dl_tensor.data, kN * sizeof(float), 2 /*D2H*/, nullptr), 0);
      EXPECT_EQ(cudaMemcpyAsync(g, ones.data(), kN * sizeof(float), 1 /*H2D*/, nullptr), 0);
      EXPECT_EQ(zoe_wait_stream(e, nullptr), ZOE_OK) << zoe_last_error();
      EXPECT_EQ(zoe_grads_ready(e, u, &gt), ZOE_OK) << zoe_last_error();
      EXPECT_EQ(cudaMemsetAsync(g, 0xff, kN * sizeof(float), nullptr), 0);  // NaNs, were they read now
      EXPECT_EQ(zoe_release(e, u), ZOE_OK) << zoe_last_error();
      t->deleter(t);
      EXPECT_EQ(cudaStreamSynchronize(nullptr), 0);
      seen.insert(seen.end(), w.begin(), w.end());
    }
    EXPECT_EQ(zoe_step(e, 1e-2, nullptr), ZOE_OK) << zoe_last_error();
  }
  EXPECT_EQ(cudaFree(g), 0);
  zoe_engine_free(e);
  return seen;
}

// zoe_set_stream: the emulation runs zoe's streams late (CUDA_EMU_DELAY) and reports work on one
// stream that uses memory unordered work of another uses, so an event missing from the fetch or
// the gradient's read aborts this test; the weights equal those of the host-waiting run.
TEST(CApiEmu, ACallerStreamIsOrderedAfterFetchesAndGradientReadsByEvents) {
  if (zoe::test::test_device_name() != "cuda") GTEST_SKIP() << "the emulated GPU's test (capi_test_emu)";
  const std::vector<float> waited = caller_stream_steps(false), evented = caller_stream_steps(true);
  ASSERT_EQ(evented.size(), size_t{4 * (kD * kD + kD)});
  EXPECT_EQ(evented, waited);
  EXPECT_NE(evented.front(), evented[2 * (kD * kD + kD)]) << "the steps changed nothing";
}
#endif

// zoe_device: after zoe_start, the device fetched tensors carry (kDLCPU, or the emulated GPU's
// kDLCUDA 0), for a framework to place buffers and inputs beside them.
TEST(CApi, DeviceIsWhereFetchedTensorsLive) {
  zoe_engine* e = two_units(3, /*start=*/false);
  DLDevice d{};
  expect_error(zoe_device(e, &d), ZOE_ERR_RUNTIME, "zoe_device: the engine is not started");
  expect_error(zoe_device(e, nullptr), ZOE_ERR_INVALID, "zoe_device");
  ASSERT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
  ASSERT_EQ(zoe_device(e, &d), ZOE_OK) << zoe_last_error();
  DLManagedTensor* t = nullptr;
  ASSERT_EQ(zoe_fetch(e, 0, &t), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(d.device_type, t->dl_tensor.device.device_type);
  EXPECT_EQ(d.device_id, t->dl_tensor.device.device_id);
  EXPECT_EQ(d.device_type, zoe::test::test_device_name() == "cuda" ? kDLCUDA : kDLCPU);
  t->deleter(t);
  EXPECT_EQ(zoe_release(e, 0), ZOE_OK);
  zoe_engine_free(e);
}

// zoe.device_memory_budget "auto" (the default) becomes bytes at zoe_start: the CPU device's 8 GiB,
// or the GPU's free memory less 3 GiB (the emulated GPU: 16 GiB, little of it held); a budget in
// bytes stays as given. zoe_stats_json says which.
TEST(CApi, AnAutoDeviceBudgetIsResolvedAtStart) {
  constexpr uint64_t GiB = uint64_t{1} << 30;
  auto device_budget = [](zoe_engine* e) {
    char* stats = nullptr;
    EXPECT_EQ(zoe_stats_json(e, &stats), ZOE_OK) << zoe_last_error();
    const nlohmann::json j = nlohmann::json::parse(stats ? stats : "{}");
    zoe_free_string(stats);
    return j.at("budgets").at("device").get<uint64_t>();
  };
  zoe_engine* e = two_units(0);
  const uint64_t got = device_budget(e);
  if (zoe::test::test_device_name() == "cuda") {
    EXPECT_LE(got, 13 * GiB);
    EXPECT_GT(got, 12 * GiB);
  } else {
    EXPECT_EQ(got, 8 * GiB);
  }
  zoe_engine_free(e);
  nlohmann::json c = nlohmann::json::parse(config(0));
  c["zoe"]["device_memory_budget"] = "2GiB";
  zoe_engine* f = nullptr;
  ASSERT_EQ(zoe_engine_new(c.dump().c_str(), &f), ZOE_OK) << zoe_last_error();
  int64_t w[1] = {kD};
  ASSERT_EQ(zoe_register_param(f, "a", "a.w", 1, w, kF32, 1), ZOE_OK) << zoe_last_error();
  ASSERT_EQ(zoe_start(f), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(device_budget(f), 2 * GiB);
  zoe_engine_free(f);
}

// The CPU device has no streams: zoe_set_stream is accepted (before zoe_start it is not) and
// changes nothing.
TEST(CApi, SetStreamIsANoOpOnTheCpuDevice) {
  if (zoe::test::test_device_name() == "cuda") GTEST_SKIP() << "the CPU device's";
  zoe_engine* e = two_units(0, /*start=*/false);
  expect_error(zoe_set_stream(e, nullptr), ZOE_ERR_RUNTIME, "zoe_set_stream: the engine is not started");
  ASSERT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(zoe_set_stream(e, reinterpret_cast<void*>(0x5eed)), ZOE_OK) << zoe_last_error();
  const std::vector<float> before = fetch_copy(e, 0);
  hand_over_ones(e, 0);
  ASSERT_EQ(zoe_step(e, 1e-2, nullptr), ZOE_OK) << zoe_last_error();
  EXPECT_NE(fetch_copy(e, 0), before);
  zoe_engine_free(e);
}

TEST(CApi, CallsFromAnotherThreadAndThreadLocalErrors) {
  zoe_engine* e = two_units(3);
  DLManagedTensor* t = nullptr;
  ASSERT_NE(zoe_fetch(e, 5, &t), ZOE_OK);
  std::string other;
  std::thread th([&] {
    other = zoe_last_error();
    hand_over_ones(e, 0);  // autograd calls from its own threads
  });
  th.join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(zoe_last_error()), "");
  zoe_step_result r;
  ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  zoe_engine_free(e);
}

TEST(CApi, CloseFlushesAndNullIsANoOp) {
  EXPECT_EQ(zoe_engine_close(nullptr), ZOE_OK);
  zoe_engine* e = two_units(3);
  hand_over_ones(e, 0);
  zoe_step_result r;
  ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(zoe_engine_close(e), ZOE_OK) << zoe_last_error();  // stage 3's update ran on until here
  EXPECT_STREQ(zoe_last_error(), "");
}

// An engine whose last update (stage 3's, which runs on after zoe_step returns) fails: it reads the
// optimizer state from NVMe, and the swap files are cut to nothing under the running engine. A
// first step writes that state (never written, it reads as zeros without a request); setting the
// weights then waits for its update and drops what it read ahead for the next one.
zoe_engine* engine_whose_update_fails(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cfg = zoe::test::on_test_device("{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
                                         "\"nvme\", \"nvme_path\": \"" + dir.string() + "\"}}, \"optimizer\": {\"type\": \"AdamW\"}}");
  zoe_engine* e = nullptr;
  EXPECT_EQ(zoe_engine_new(cfg.c_str(), &e), ZOE_OK) << zoe_last_error();
  int64_t w[2] = {kD, kD}, b[1] = {kD};
  EXPECT_EQ(zoe_register_param(e, "a", "a.w", 2, w, kF32, 1), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(zoe_register_param(e, "a", "a.bias", 1, b, kF32, 0), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
  hand_over_ones(e, 0);
  zoe_step_result r;
  EXPECT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  std::vector<float> values(kD * kD, 0.5f);
  std::vector<int64_t> ws{kD, kD}, bs{kD};
  DLTensor tw = host_tensor(values.data(), ws), tb = host_tensor(values.data(), bs);
  EXPECT_EQ(zoe_set_param(e, "a.w", &tw), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(zoe_set_param(e, "a.bias", &tb), ZOE_OK) << zoe_last_error();
  hand_over_ones(e, 0);
  int cut = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
    if (f.is_regular_file() && f.path().extension() == ".swap") {
      std::filesystem::resize_file(f.path(), 0);
      ++cut;
    }
  EXPECT_GT(cut, 0) << "no swap file under " << dir;
  EXPECT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  return e;
}

// The update's error used to be dropped at zoe_engine_free: zoe_engine_close returns it, and
// zoe_engine_free, which cannot, logs it.
TEST(CApi, CloseReturnsTheLastUpdatesErrorAndFreeLogsIt) {
  auto dir = std::filesystem::temp_directory_path() / ("zoe_capi_close_" + std::to_string(::getpid()));
  expect_error(zoe_engine_close(engine_whose_update_fails(dir)), ZOE_ERR_IO, ".swap");
  zoe_engine* e = engine_whose_update_fails(dir);
  testing::internal::CaptureStderr();
  zoe_engine_free(e);
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_NE(logged.find("zoe_engine_free: "), std::string::npos) << logged;
  EXPECT_NE(logged.find(".swap"), std::string::npos) << logged;
  std::filesystem::remove_all(dir);
}

TEST(CApi, SaveLoadExportAndSafetensorsStart) {
  auto dir = std::filesystem::temp_directory_path() / ("zoe_capi_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  zoe_engine* e = two_units(3);
  std::vector<float> init(kD * kD);
  for (int i = 0; i < kD * kD; ++i) init[i] = 0.1f * i;
  std::vector<int64_t> w{kD, kD};
  DLTensor t = host_tensor(init.data(), w);
  ASSERT_EQ(zoe_set_param(e, "b.w", &t), ZOE_OK);
  EXPECT_EQ(fetch_copy(e, 1)[3], 0.0f) << "b is applied only when all its tensors are set";
  std::vector<float> bias(kD, 2.0f);
  std::vector<int64_t> bs{kD};
  DLTensor tb = host_tensor(bias.data(), bs);
  ASSERT_EQ(zoe_set_param(e, "b.bias", &tb), ZOE_OK);
  EXPECT_FLOAT_EQ(fetch_copy(e, 1)[3], 0.3f);
  hand_over_ones(e, 0);
  hand_over_ones(e, 1);
  zoe_step_result r;
  ASSERT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  ASSERT_EQ(zoe_save(e, (dir / "ckpt").c_str()), ZOE_OK) << zoe_last_error();
  ASSERT_EQ(zoe_export(e, (dir / "w.safetensors").c_str()), ZOE_OK) << zoe_last_error();
  std::vector<float> a1 = fetch_copy(e, 0), b1 = fetch_copy(e, 1);
  char* stats = nullptr;
  ASSERT_EQ(zoe_stats_json(e, &stats), ZOE_OK);
  EXPECT_NE(std::string(stats).find("\"ledger\""), std::string::npos) << stats;
  EXPECT_NE(std::string(stats).find("\"steps_applied\":1"), std::string::npos) << stats;
  zoe_free_string(stats);
  zoe_engine_free(e);

  zoe_engine* f = two_units(1);  // another stage: checkpoints load at any stage
  ASSERT_EQ(zoe_load(f, (dir / "ckpt").c_str()), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(fetch_copy(f, 0), a1);
  EXPECT_EQ(fetch_copy(f, 1), b1);
  zoe_engine_free(f);
  zoe_engine* g = two_units(0);
  ASSERT_EQ(zoe_load_safetensors(g, (dir / "w.safetensors").c_str()), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(fetch_copy(g, 0), a1);
  EXPECT_EQ(fetch_copy(g, 1), b1);
  expect_error(zoe_load(g, (dir / "none").c_str()), ZOE_ERR_INVALID, "no complete checkpoint");
  zoe_engine_free(g);
  std::filesystem::remove_all(dir);
}

}  // namespace

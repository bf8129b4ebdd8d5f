// The C API across ranks (mpirun -np 2, 3, 4), through zoe/zoe.h and libzoe.so only: a gradient
// that only some ranks hand over, a step before any gradient, and ranks that fetch different
// units each end in an error on every rank, never a hang, and training goes on after it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "dl_read.h"
#include "test_util.h"
#include "zoe/zoe.h"

namespace {

constexpr int64_t kN = 10;  // elements per unit: not a multiple of the rank count
const DLDataType kF32{kDLFloat, 32, 1};

zoe_engine* make_engine(int stage) {
  std::string cfg = zoe::test::on_test_device("{\"zero_optimization\": {\"stage\": " + std::to_string(stage) +
                                   "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}");
  zoe_engine* e = nullptr;
  EXPECT_EQ(zoe_engine_new(cfg.c_str(), &e), ZOE_OK) << zoe_last_error();
  int64_t shape[1] = {kN};
  EXPECT_EQ(zoe_register_param(e, "u0", "u0.x", 1, shape, kF32, 0), ZOE_OK);
  EXPECT_EQ(zoe_register_param(e, "u1", "u1.x", 1, shape, kF32, 0), ZOE_OK);
  EXPECT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
  return e;
}

void hand_over(zoe_engine* e, int u, float value) {
  std::vector<float> g(kN);
  for (int i = 0; i < kN; ++i) g[i] = value * (i + 1);
  int64_t shape[1] = {kN};
  DLTensor t{};
  t.data = g.data();
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = kF32;
  t.shape = shape;
  ASSERT_EQ(zoe_grads_ready(e, u, &t), ZOE_OK) << zoe_last_error();
}

std::vector<float> weights(zoe_engine* e, int u) {
  DLManagedTensor* t = nullptr;
  EXPECT_EQ(zoe_fetch(e, u, &t), ZOE_OK) << zoe_last_error();
  if (!t) return {};
  std::vector<float> v = zoe::test::read_floats(t->dl_tensor, kN);
  t->deleter(t);
  EXPECT_EQ(zoe_release(e, u), ZOE_OK);
  return v;
}

// Unit 0's gradient comes from rank 0 only: zoe_step fails on every rank, naming the unit, and
// drops the step's gradients; the next step, with every rank handing over, trains as if the
// failed one never happened.
std::vector<float> train_gap(int stage, bool gap_first) {
  zoe_engine* e = make_engine(stage);
  int rank = zoe_rank(e);
  zoe_step_result r;
  if (gap_first) {
    hand_over(e, 1, 5.0f);
    if (rank == 0) hand_over(e, 0, 7.0f);
    EXPECT_EQ(zoe_step(e, 1e-2, &r), ZOE_ERR_RUNTIME) << "stage " << stage;
    std::string msg = zoe_last_error();
    EXPECT_NE(msg.find("unit 'u0'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dropped"), std::string::npos) << msg;
  }
  for (int step = 0; step < 3; ++step) {
    hand_over(e, 1, 1.0f + rank);
    hand_over(e, 0, rank == 0 ? 2.0f : 0.0f);  // zeros where a rank has no gradient
    EXPECT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  }
  std::vector<float> w = weights(e, 0), w1 = weights(e, 1);
  w.insert(w.end(), w1.begin(), w1.end());
  zoe_engine_free(e);
  return w;
}

TEST(CApiMpi, AGradientOnOneRankOnlyIsAnErrorOnEveryRank) {
  for (int stage : {0, 2, 3}) {
    std::vector<float> after_error = train_gap(stage, true), clean = train_gap(stage, false);
    EXPECT_EQ(after_error, clean) << "stage " << stage << ": the failed step left something behind";
    EXPECT_NE(clean[0], 0.0f);
  }
}

TEST(CApiMpi, StepBeforeAnyGradientIsAnErrorOnEveryRank) {
  for (int stage : {0, 3}) {
    zoe_engine* e = make_engine(stage);
    zoe_step_result r;
    EXPECT_EQ(zoe_step(e, 1e-2, &r), ZOE_ERR_RUNTIME) << "stage " << stage;
    EXPECT_NE(std::string(zoe_last_error()).find("before any gradient"), std::string::npos) << zoe_last_error();
    hand_over(e, 0, 1.0f);
    EXPECT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
    zoe_engine_free(e);
  }
}

TEST(CApiMpi, RanksFetchingDifferentUnitsFailTogether) {
  zoe_engine* e = make_engine(3);
  int rank = zoe_rank(e);
  DLManagedTensor* t = nullptr;
  EXPECT_EQ(zoe_fetch(e, rank == 0 ? 0 : 1, &t), ZOE_ERR_RUNTIME);
  EXPECT_NE(std::string(zoe_last_error()).find("out of step"), std::string::npos) << zoe_last_error();
  EXPECT_EQ(t, nullptr);
  // Afterwards the ranks agree again and train on.
  EXPECT_EQ(weights(e, 0).size(), static_cast<size_t>(kN));
  hand_over(e, 0, 1.0f);
  zoe_step_result r;
  EXPECT_EQ(zoe_step(e, 1e-2, &r), ZOE_OK) << zoe_last_error();
  zoe_engine_free(e);
}

}  // namespace

// MPI is started here (the C API then finds it started and leaves it to us).
int main(int argc, char** argv) {
  int provided = 0;
#ifdef ZOE_CUDA_EMU  // the emulated NCCL calls MPI from the streams' threads
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#else
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  int rc = RUN_ALL_TESTS(), worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst != 0 ? 1 : 0;
}

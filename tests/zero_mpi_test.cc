// The ZeRO core under mpirun with N = 2, 3, 4 ranks: ledger, communication volume and
// equivalence across stages. (N = 1 is covered by zero_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine_harness.h"
#include "model/gpt2_model.h"
#include "sched/memory_estimate.h"
#include "sched/shard_layout.h"

namespace zoe::test {
namespace {

Comm* g_comm = nullptr;

uint64_t persistent_of(const LedgerSnapshot& l, Kind k) {
  uint64_t s = 0;
  for (int t = 0; t < kNumTiers; ++t) s += l.bytes[t][static_cast<int>(k)];
  return s;
}

TEST(ZeroMpi, LedgerMatchesSeedFormulaPlusPaddingExactly) {
  const int N = g_comm->size();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      Config c = mlp_config(stage, dt);
      auto run = run_mlp(c, *g_comm, 1);
      ASSERT_TRUE(run.ok()) << run.status().message();
      // The padding rule: each unit of n elements padded to N*ceil(n/N).
      int64_t unit = int64_t{c.n_embd} * c.n_embd + c.n_embd + 1, chunk = (unit + N - 1) / N;
      ASSERT_NE(unit % N, 0) << "pick a width no N divides";
      ASSERT_NE(c.n_layer * unit % N, 0) << "pick a P no N divides";
      EXPECT_EQ(run->shard, c.n_layer * chunk);
      EXPECT_EQ(run->padded, N * run->shard);
      double Pp = static_cast<double>(run->padded), S = static_cast<double>(run->shard);
      // 16P, 4P + 12P/N, 2P + 14P/N, 16P/N with P -> P_pad and P/N -> S.
      double expected[] = {16 * Pp, 4 * Pp + 12 * S, 2 * Pp + 14 * S, 16 * S};
      EXPECT_EQ(static_cast<double>(run->ledger.persistent(Tier::kDevice)), expected[stage]) << "stage " << stage;
      StageMemory m = exact_stage(run->padded, run->shard, stage, dt, OffloadDevice::kNone, OffloadDevice::kNone);
      for (int k = 0; k < kNumPersistentKinds; ++k)
        EXPECT_EQ(static_cast<double>(persistent_of(run->ledger, static_cast<Kind>(k))), m.by_kind[k])
            << "stage " << stage << " kind " << kind_name(static_cast<Kind>(k));
    }
  }
}

TEST(ZeroMpi, OffloadTiersMoveBytesNotTotals) {
  Config c = mlp_config(3, DType::kBF16);
  c.offload_optimizer.device = OffloadDevice::kCpu;
  c.offload_param.device = OffloadDevice::kCpu;
  auto run = run_mlp(c, *g_comm, 2);
  ASSERT_TRUE(run.ok()) << run.status().message();
  double S = static_cast<double>(run->shard);
  EXPECT_EQ(static_cast<double>(run->ledger.persistent(Tier::kHost)), 14 * S);   // param + master, m, v
  EXPECT_EQ(static_cast<double>(run->ledger.persistent(Tier::kDevice)), 2 * S);  // the gradient shard
}

TEST(ZeroMpi, CommBytesStages012EqualStage3IsOneAndAHalf) {
  const uint64_t N = g_comm->size();
  uint64_t agrs[4] = {0, 0, 0, 0}, ar[4] = {0, 0, 0, 0};
  for (int stage = 0; stage <= 3; ++stage) {
    Config c = mlp_config(stage, DType::kBF16);
    auto run = run_mlp(c, *g_comm, 2);
    ASSERT_TRUE(run.ok()) << run.status().message();
    const CommBytes& b = run->comm.back();
    uint64_t S = run->shard, w = 2;
    // Exact per-step volumes: one chunk of every unit to each of the N-1 peers per pass.
    uint64_t pass = (N - 1) * S * w;
    EXPECT_EQ(b.reduce_scatter, pass) << "stage " << stage;
    EXPECT_EQ(b.all_gather, stage == 3 ? 2 * pass : pass) << "stage " << stage;
    agrs[stage] = b.all_gather + b.reduce_scatter;
    ar[stage] = b.all_reduce;
  }
  EXPECT_EQ(agrs[1], agrs[0]);
  EXPECT_EQ(agrs[2], agrs[0]);
  EXPECT_EQ(2 * agrs[3], 3 * agrs[0]);  // exactly 1.5x
  EXPECT_EQ(ar[1], ar[0]);              // the norm's scalar all-reduce, the same at every stage
  EXPECT_EQ(ar[3], ar[0]);
}

TEST(ZeroMpi, Fp32StagesAreBitwiseIdenticalAfterFiveSteps) {
  std::vector<float> ref;
  for (int stage = 0; stage <= 3; ++stage) {
    auto run = run_mlp(mlp_config(stage, DType::kF32), *g_comm, 5);
    ASSERT_TRUE(run.ok()) << run.status().message();
    if (stage == 0) {
      ref = run->params;
      continue;
    }
    ASSERT_EQ(run->params.size(), ref.size());
    EXPECT_EQ(std::memcmp(run->params.data(), ref.data(), ref.size() * 4), 0) << "stage " << stage << " differs";
  }
}

TEST(ZeroMpi, Bf16StagesAreBitwiseIdenticalToo) {
  std::vector<float> ref;
  for (int stage = 0; stage <= 3; ++stage) {
    auto run = run_mlp(mlp_config(stage, DType::kBF16), *g_comm, 5);
    ASSERT_TRUE(run.ok()) << run.status().message();
    if (stage == 0) ref = run->params;
    else EXPECT_EQ(std::memcmp(run->params.data(), ref.data(), ref.size() * 4), 0) << "stage " << stage;
  }
}

TEST(ZeroMpi, Gpt2StagesAreBitwiseIdenticalInFp32) {
  // The real model through the same unit API: embeddings fetched twice, tied head, blocks.
  gpt2::Gpt2Shape shape{2, 2, 16, 256, 16};
  std::vector<float> ref;
  for (int stage = 0; stage <= 3; ++stage) {
    Config c = mlp_config(stage, DType::kF32);
    c.micro_batch = 2;
    for (bool ckpt : {false, true}) {
      if (ckpt && stage != 3) continue;
      Gpt2Model model(shape, ckpt);
      auto src = make_token_source(ZOE_SOURCE_DIR "/data/corpus.txt", "bytes", 256, c.micro_batch, 16,
                                   g_comm->rank(), g_comm->size());
      ASSERT_TRUE(src.ok()) << src.status().message();
      auto run = run_model(c, *g_comm, 3, model, **src);
      ASSERT_TRUE(run.ok()) << run.status().message();
      if (stage == 0) {
        ref = run->params;
        continue;
      }
      ASSERT_EQ(run->params.size(), ref.size());
      EXPECT_EQ(std::memcmp(run->params.data(), ref.data(), ref.size() * 4), 0)
          << "stage " << stage << (ckpt ? " with activation checkpointing" : "") << " differs";
    }
  }
}

TEST(ZeroMpi, UnitsSmallerThanTheWorldStillTrainIdentically) {
  // Width 1: 3 elements per unit, so with 4 ranks one rank owns only padding.
  std::vector<float> ref;
  for (int stage : {0, 3}) {
    auto run = run_mlp(mlp_config(stage, DType::kF32, 2, 1), *g_comm, 3);
    ASSERT_TRUE(run.ok()) << run.status().message();
    if (stage == 0) ref = run->params;
    else EXPECT_EQ(std::memcmp(run->params.data(), ref.data(), ref.size() * 4), 0);
  }
}

TEST(ZeroMpi, OneRankWithAccumulationEqualsNRanks) {
  // N ranks, one micro-batch each == one rank accumulating N micro-batches: the same global
  // batch in the same order. Every rank runs the one-rank job locally and compares.
  const int N = g_comm->size();
  for (int stage : {0, 3}) {
    Config c = mlp_config(stage, DType::kF32);
    auto multi = run_mlp(c, *g_comm, 5);
    ASSERT_TRUE(multi.ok()) << multi.status().message();
    Config c1 = c;
    c1.grad_accum = N;
    auto self = make_self_comm();
    auto single = run_mlp(c1, *self, 5);
    ASSERT_TRUE(single.ok()) << single.status().message();
    ASSERT_EQ(single->params.size(), multi->params.size());
    double worst = 0;
    for (size_t i = 0; i < multi->params.size(); ++i) {
      double a = multi->params[i], b = single->params[i];
      worst = std::max(worst, std::abs(a - b) / std::max(std::abs(b), 1e-3));
    }
    EXPECT_LT(worst, 1e-6) << "stage " << stage;
  }
}

TEST(ZeroMpi, LossFallsInEveryPrecision) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Config c = mlp_config(3, dt);
    auto run = run_mlp(c, *g_comm, 30);
    ASSERT_TRUE(run.ok()) << run.status().message();
    double l[2] = {run->losses.front(), run->losses.back()};
    ASSERT_TRUE(g_comm->all_reduce_sum(l, 2).ok());
    EXPECT_LT(l[1], 0.7 * l[0]) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace zoe::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = zoe::make_mpi_comm();
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().message().c_str());
    return 1;
  }
  zoe::test::g_comm = comm->get();
  // Only rank 0 prints the gtest listing; every rank's failures still fail the run.
  if (comm.value()->rank() != 0) {
    auto& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  double worst = rc;
  (void)comm.value()->all_reduce_sum(&worst, 1);
  comm.value().reset();
  zoe::finalize_mpi();
  return worst != 0 ? 1 : 0;
}

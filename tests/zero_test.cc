// The ZeRO core on one rank: shard layout and padding, ledger, loss scaling and overflow, the MLP
// test model's gradients, learning-rate schedules.
#include <gtest/gtest.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <limits>
#include <new>
#include <stdexcept>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/rng.h"
#include "capture_engine.h"
#include "engine_harness.h"
#include "nvme/fault_injecting_env.h"
#include "sched/comm_worker.h"
#include "sched/loss_scaler.h"
#include "sched/shard_layout.h"
#include "sched/zero_engine.h"
#include "test_util.h"
#include "train/lr_schedule.h"
#include "train/engine_options.h"

namespace zoe::test {
namespace {

TEST(ShardLayout, PadsEachUnitToAMultipleOfN) {
  std::vector<UnitSpec> units = {make_unit("a", {{"w", {7, 3}}, {"b", {3}}}), make_unit("b", {{"x", {5}}})};
  for (int n = 1; n <= 7; ++n) {
    ShardLayout l(units, n);
    EXPECT_EQ(l.params(), 29);
    int64_t c0 = (24 + n - 1) / n, c1 = (5 + n - 1) / n;
    EXPECT_EQ(l.shard_size(), c0 + c1);
    EXPECT_EQ(l.padded_params(), n * (c0 + c1));
    EXPECT_LE(l.padded_params() - l.params(), 2 * (n - 1));
    int64_t owned = 0;
    for (int r = 0; r < n; ++r) owned += l.owned_real(0, r) + l.owned_real(1, r);
    EXPECT_EQ(owned, 29) << "every real element has exactly one owner, n=" << n;
  }
}

TEST(ShardLayout, SegmentsSplitAtTensorsAndCarryDecay) {
  ShardLayout l({make_unit("a", {{"w", {4, 2}}, {"b", {2}}, {"g", {1}}})}, 3);  // 11 -> chunks of 4
  auto seg = l.segments(0, 4, 8);  // elements 4..7 of w (ends at 8)
  ASSERT_EQ(seg.size(), 1u);
  EXPECT_TRUE(seg[0].decay);
  seg = l.segments(0, 8, 12);  // b (8,9), g (10); 11 is padding
  ASSERT_EQ(seg.size(), 2u);
  EXPECT_EQ(seg[0].begin, 0);
  EXPECT_EQ(seg[0].end, 2);
  EXPECT_FALSE(seg[0].decay);
  EXPECT_EQ(seg[1].begin, 2);
  EXPECT_EQ(seg[1].end, 3);
}

TEST(ZeroOneRank, LedgerIsSixteenBytesPerParameterAtEveryStage) {
  auto self = make_self_comm();
  for (int stage = 0; stage <= 3; ++stage) {
    Config c = mlp_config(stage, DType::kBF16);
    auto run = run_mlp(c, *self, 1);
    ASSERT_TRUE(run.ok()) << run.status().message();
    int64_t P = c.n_layer * (int64_t{c.n_embd} * c.n_embd + c.n_embd + 1);
    EXPECT_EQ(run->padded, P);  // N = 1: no padding
    EXPECT_EQ(run->ledger.persistent(Tier::kDevice), uint64_t(16 * P)) << "stage " << stage;
    EXPECT_EQ(run->comm.back().total(), 0u);
  }
}

TEST(ZeroOneRank, DeviceBudgetIsEnforcedWithAClearError) {
  auto self = make_self_comm();
  Config c = mlp_config(0, DType::kBF16);
  c.device_memory_budget = 4096;
  auto run = run_mlp(c, *self, 1);
  ASSERT_FALSE(run.ok());
  // A bad config (exit 2) found before the state is allocated, not an out-of-memory error.
  EXPECT_EQ(run.status().code(), Code::kInvalidInput);
  EXPECT_NE(run.status().message().find("config key 'zoe.device_memory_budget'"), std::string::npos)
      << run.status().message();
  EXPECT_NE(run.status().message().find("its state on the device needs"), std::string::npos) << run.status().message();
}

// A job the device budget cannot hold is refused before anything is allocated, naming each single
// change that would make it fit and what that needs, from the ledger's bytes (worked by hand: one
// unit of 1000 bf16 parameters at stage 1 and one rank).
TEST(ZeroOneRank, ABudgetTooSmallNamesTheChangesThatWouldFit) {
  Config c;
  c.dtype = DType::kBF16;
  c.stage = 1;
  c.device_memory_budget = 12000;
  c.host_memory_budget = 1 << 20;
  CpuDevice dev{c.device_memory_budget, c.host_memory_budget, true};
  auto self = make_self_comm();
  ZeroEngine e(engine_options(c), dev, *self, {make_unit("u", {{"w", {40, 25}}})});
  const Status st = e.allocate();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kInvalidInput);
  const std::string& m = st.message();
  // Stage 1, one rank: bf16 weights 2000 + gradients 2000 + fp32 master and moments 12000 bytes on
  // the device, and the unit's fp32 gradient in flight 4000: 20000 bytes against 12000.
  EXPECT_NE(m.find("its state on the device needs 16000 bytes (15.6 KiB) and unit 'u' in flight 4000 bytes (3.9 KiB) "
                   "more (20000 bytes (19.5 KiB) in all)"),
            std::string::npos) << m;
  // The reducer's norm (one double) already holds 8 bytes of the budget.
  EXPECT_NE(m.find("11992 bytes (11.7 KiB) of the budget is free; it would fit with zoe.device_memory_budget 20008 "
                   "bytes (19.5 KiB) or more"),
            std::string::npos) << m;
  // The optimizer in host memory: 2000 + 2000 + 4000 in flight.
  EXPECT_NE(m.find("or zero_optimization.offload_optimizer.device \"cpu\" (needs 8000 bytes (7.8 KiB))"),
            std::string::npos) << m;
  // Three ranks: 2000 + 2000 + 12 x 334 (the shard of 1000 padded to 1002) + 4000 = 12008 > 11992;
  // four: 12 x 250 = 3000, 11000 in all.
  EXPECT_NE(m.find("or 4 ranks (needs 11000 bytes (10.7 KiB))"), std::string::npos) << m;
  // Stage 3 at one rank only adds the gathered weights and a reduction buffer: not offered.
  EXPECT_EQ(m.find("zero_optimization.stage 3"), std::string::npos) << m;
}

// A unit of 10 elements, driven by hand, to see exactly what a step does with a bad gradient.
struct TinyEngine {
  Config c;
  CpuDevice dev{1 << 20, 1 << 20, true};
  std::unique_ptr<Comm> comm = make_self_comm();
  std::unique_ptr<ZeroEngine> e;
  explicit TinyEngine(DType dt, int stage = 3, bool update_in_backward = false) {
    c.dtype = dt;
    c.stage = stage;
    c.update_in_backward = update_in_backward;
    if (update_in_backward) c.grad_clip = 0;
    e = std::make_unique<ZeroEngine>(engine_options(c), dev, *comm, std::vector<UnitSpec>{make_unit("u", {{"w", {2, 5}}})});
    EXPECT_TRUE(e->allocate().ok());
    std::vector<float> v(10);
    for (int i = 0; i < 10; ++i) v[i] = 0.1f * (i + 1);
    EXPECT_TRUE(e->set_params(0, v.data()).ok());
  }
  std::vector<float> state() {
    OwnedRange o = e->owned_range(0);
    std::vector<float> s, part(o.end - o.begin);
    for (OwnedKind k : {OwnedKind::kMaster, OwnedKind::kExpAvg, OwnedKind::kExpAvgSq}) {
      EXPECT_TRUE(e->read_owned(0, k, o.begin, o.end, part.data()).ok());
      s.insert(s.end(), part.begin(), part.end());
    }
    return s;
  }
};

// A copy of v in device memory (free it with dev.free).
Buffer on_device(Device& dev, const std::vector<float>& v) {
  Buffer b = dev.alloc(v.size() * 4, Tier::kDevice, Kind::kStaging).value();
  EXPECT_TRUE(dev.upload(b.data, v.data(), v.size() * 4).ok());
  return b;
}

// Fills the device tier until not even 64 bytes fit, so the engine's next alloc fails.
std::vector<Buffer> fill_device(Device& dev) {
  std::vector<Buffer> held;
  for (size_t block : {size_t{1} << 20, size_t{4096}, size_t{64}})
    for (auto b = dev.alloc(block, Tier::kDevice, Kind::kStaging); b.ok(); b = dev.alloc(block, Tier::kDevice, Kind::kStaging))
      held.push_back(*b);
  return held;
}

// Error paths leave no state behind: a failed fetch holds no reference, and a gradient whose
// reduction failed counts as not handed over (the step then uses zeros for it, not a stale one).
// At one rank a step's first reduction needs no buffer (GradReducer::reduce_alone): it fails here
// on a gradient the device cannot reach.
TEST(ZeroOneRank, FailedFetchAndGradsReadyLeaveNoStateBehind) {
  for (int stage : {2, 3}) {
    Config c = mlp_config(stage, DType::kF32, 2, 16);
    // Two devices, so two communicators: a Comm works on the memory of the device it is paired with.
    auto self = make_self_comm(), ref_self = make_self_comm();
    CpuDevice dev(c.device_memory_budget, c.host_memory_budget, true), ref_dev(c.device_memory_budget, c.host_memory_budget, true);
    MlpModel model(c.n_layer, c.n_embd, 99);
    ZeroEngine e(engine_options(c), dev, *self, model.units()), ref(engine_options(c), ref_dev, *ref_self, model.units());
    ASSERT_TRUE(e.allocate().ok());
    ASSERT_TRUE(ref.allocate().ok());
    std::vector<float> h0 = random_floats(e.unit(0).numel, 1), h1 = random_floats(e.unit(1).numel, 2);
    // Gradients are device memory, uploaded before the device is filled.
    Buffer d0 = on_device(dev, h0), d1 = on_device(dev, h1), r0 = on_device(ref_dev, h0), r1 = on_device(ref_dev, h1);
    const float *g0 = d0.as<float>(), *g1 = d1.as<float>();
    // one good step leaves reduced gradients in place
    for (auto [x, a, b] : {std::tuple{&e, g0, g1}, std::tuple{&ref, r0.as<const float>(), r1.as<const float>()}}) {
      Status st = x->grads_ready(1, b);
      if (st.ok()) st = x->grads_ready(0, a);
      if (st.ok()) st = x->step(1e-3).status();
      ASSERT_TRUE(st.ok()) << st.message();
    }
    std::vector<Buffer> filler = fill_device(dev);
    ASSERT_FALSE(filler.empty());
    if (stage == 3) {
      EXPECT_FALSE(e.fetch(0).ok()) << "no room for the gather";
      EXPECT_FALSE(e.release(0).ok()) << "the failed fetch must hold no reference";
    }
    for (Buffer& b : filler) dev.free(b);
    EXPECT_FALSE(e.grads_ready(1, h1.data()).ok()) << "plain host memory is no gradient the device can reach";
    ASSERT_TRUE(e.grads_ready(0, g0).ok());
    ASSERT_TRUE(ref.grads_ready(0, r0.as<float>()).ok());  // the reference hands over unit 0 only
    auto a = e.step(1e-3), b = ref.step(1e-3);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->grad_norm, b->grad_norm) << "stage " << stage << ": the failed unit must count as zeros";
    if (stage == 3) {
      auto v = e.fetch(0);
      ASSERT_TRUE(v.ok()) << v.status().message();
      EXPECT_NE(v->data, nullptr);
      EXPECT_TRUE(e.release(0).ok());
    }
    for (Buffer* b : {&d0, &d1}) dev.free(*b);
    for (Buffer* b : {&r0, &r1}) ref_dev.free(*b);
  }
}

// Stage 3 at one rank with two micro-steps a step, the first handed over by start(): only the
// second's reductions take a buffer (GradReducer::reduce_alone makes the first's).
struct SecondMicroStep {
  static Config config() {
    Config c = mlp_config(3, DType::kF32, 2, 16);
    c.grad_accum = 2;
    return c;
  }
  Config c = config();
  std::unique_ptr<Comm> self = make_self_comm();
  CpuDevice dev{c.device_memory_budget, c.host_memory_budget, true};
  MlpModel model{c.n_layer, c.n_embd, 5};
  ZeroEngine e{engine_options(c), dev, *self, model.units()};
  std::vector<float> h0, h1;
  Buffer d0, d1;  // h0, h1 in device memory

  Status start() {
    ZOE_RETURN_IF_ERROR(e.allocate());
    h0 = random_floats(e.unit(0).numel, 1);
    h1 = random_floats(e.unit(1).numel, 2);
    d0 = on_device(dev, h0);
    d1 = on_device(dev, h1);
    for (int u : {1, 0}) ZOE_RETURN_IF_ERROR(e.grads_ready(u, grad(u)));
    return Status::Ok();
  }
  const float* grad(int u) const { return (u ? d1 : d0).as<float>(); }
  ~SecondMicroStep() {
    dev.free(d0);
    dev.free(d1);
  }
};

// A device full in the middle of a step is an error naming the unit and what its memory was for
// (the gather, the gradient's reduction buffer, the buffer a gradient is handed over from), after
// the engine gave up what it could; once there is room again the step goes on and trains.
TEST(ZeroOneRank, AFullDeviceIsAnErrorNamingTheUnitAndWhatFor) {
  SecondMicroStep t;
  ASSERT_TRUE(t.start().ok());
  ZeroEngine& e = t.e;
  std::vector<Buffer> filler = fill_device(t.dev);
  auto said = [](const Status& st, const std::string& unit, const std::string& what) {
    return st.code() == Code::kOutOfMemory && st.message().find("unit '" + unit + "'") != std::string::npos &&
           st.message().find(what) != std::string::npos && st.message().find("budget exhausted") != std::string::npos;
  };
  Status fetch = e.fetch(0).status();
  EXPECT_TRUE(said(fetch, e.unit(0).name, "fetch of")) << fetch.message();
  Status reduce = e.grads_ready(1, t.grad(1));
  EXPECT_TRUE(said(reduce, e.unit(1).name, "reduction buffer")) << reduce.message();
  Status staged = grads_from_host(e, 0, t.h0.data());
  EXPECT_TRUE(said(staged, e.unit(0).name, "handed over from")) << staged.message();
  for (Buffer& b : filler) t.dev.free(b);
  for (int u : {1, 0}) ASSERT_TRUE(e.grads_ready(u, t.grad(u)).ok());
  auto step = e.step(1e-3);
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_TRUE(step->applied);
  EXPECT_TRUE(e.flush().ok());
  EXPECT_TRUE(e.fetch(0).ok());
  EXPECT_TRUE(e.release(0).ok());
}

// A full device gives up what the engine holds idle (free gather buffers, units kept for reuse)
// for a gradient's reduction buffer; before, the hand-over failed ("budget exhausted") after a
// block that had every unit gathered at once (zoe.torch.gathered) left them in the pool.
TEST(ZeroOneRank, AReductionBufferTakesTheRoomOfIdleGatherBuffers) {
  SecondMicroStep t;
  ASSERT_TRUE(t.start().ok());
  ZeroEngine& e = t.e;
  for (int u : {0, 1}) ASSERT_TRUE(e.fetch(u).ok());  // both gathered at once
  for (int u : {0, 1}) ASSERT_TRUE(e.release(u).ok());
  std::vector<Buffer> filler = fill_device(t.dev);  // nothing else fits: only the idle buffers can go
  Status st = e.grads_ready(1, t.grad(1));
  EXPECT_TRUE(st.ok()) << st.message();
  for (Buffer& b : filler) t.dev.free(b);
  ASSERT_TRUE(e.grads_ready(0, t.grad(0)).ok());
  EXPECT_TRUE(e.step(1e-3).ok());
  EXPECT_TRUE(e.flush().ok());
}

// At one rank without accumulation a unit's share of the norm is made as its gradient goes into
// its shard (GradReducer::reduce_alone, Device::convert_sum_squares), not by a pass after the
// backward: the norm is bitwise the one that pass makes. The reference takes the other path with
// a second micro-step of zeros (its gradient the same bits; its norm halved by the mean, exactly).
TEST(ZeroOneRank, TheNormMadeAtTheHandOverIsBitwiseTheNormMadeAfterIt) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int stage : {2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + std::string(dtype_name(dt)));
      // Units within one of the CPU device's parallel grains (32 Ki): this test also runs under
      // TSan, which cannot see oneTBB's (uninstrumented) joins; Convert.* covers sums across blocks.
      Config c = mlp_config(stage, dt, 3, 150);
      Config two = c;
      two.grad_accum = 2;
      auto self = make_self_comm(), ref_self = make_self_comm();
      CpuDevice dev(c.device_memory_budget, c.host_memory_budget, true), ref_dev(c.device_memory_budget, c.host_memory_budget, true);
      MlpModel model(c.n_layer, c.n_embd, 17);
      ZeroEngine e(engine_options(c), dev, *self, model.units()), ref(engine_options(two), ref_dev, *ref_self, model.units());
      ASSERT_TRUE(e.allocate().ok());
      ASSERT_TRUE(ref.allocate().ok());
      for (int step = 0; step < 2; ++step) {
        for (int u = e.num_units() - 1; u >= 0; --u) {
          std::vector<float> g = random_floats(e.unit(u).numel, 100 * step + u);
          std::vector<float> zeros(g.size(), 0.0f);
          Buffer d = on_device(dev, g), r = on_device(ref_dev, g), z = on_device(ref_dev, zeros);
          ASSERT_TRUE(e.grads_ready(u, d.as<float>()).ok());
          ASSERT_TRUE(ref.grads_ready(u, r.as<float>()).ok());
          ASSERT_TRUE(ref.grads_ready(u, z.as<float>()).ok());
          dev.free(d);
          for (Buffer* b : {&r, &z}) ref_dev.free(*b);
        }
        auto a = e.step(1e-3), b = ref.step(1e-3);
        ASSERT_TRUE(a.ok() && b.ok());
        EXPECT_EQ(std::bit_cast<uint64_t>(a->grad_norm * 0.5), std::bit_cast<uint64_t>(b->grad_norm))
            << a->grad_norm << " vs " << b->grad_norm;
      }
      EXPECT_EQ(e.sched_stats().norm_shares_at_hand_over, 2 * e.num_units());
      EXPECT_EQ(ref.sched_stats().norm_shares_at_hand_over, 0);
    }
}

TEST(ZeroOneRank, StateOnNvmeTrainsBitwiseAsInMemory) {
  auto self = make_self_comm();
  EXPECT_EQ(check_nvme_matches_memory(*self), "");
}

TEST(ZeroOneRank, StepsOutOfTheRecordedOrderStillGiveTheRightWeights) {
  auto self = make_self_comm();
  EXPECT_EQ(check_reordered_steps_match(*self), "");
}

TEST(ZeroOneRank, AQuarterOfTheFootprintAsDeviceBudgetTrainsWithinIt) {
  auto self = make_self_comm();
  EXPECT_EQ(check_quarter_budget(*self), "");
}

TEST(ZeroOneRank, OverlappedReductionsAreBitwiseTheHandOverOnes) {
  auto self = make_self_comm();
  EXPECT_EQ(check_overlapped_reductions(*self), "");
}

TEST(ZeroOneRank, UpdateDuringTheBackwardIsBitwiseTheUpdateAfterIt) {
  auto self = make_self_comm();
  EXPECT_EQ(check_update_in_backward(*self), "");
}

TEST(ZeroOneRank, UpdateDuringTheBackwardIsTakenBackWhereClippingOrOverflowOverrulesIt) {
  auto self = make_self_comm();
  EXPECT_EQ(check_speculative_update(*self), "");
}

// An update begun in the backward with another lr than step()'s is an error naming both, and the
// engine goes on with the next step; one whose gradients turn out not finite is taken back: the
// step is skipped and the state is what it was, within roundings.
TEST(ZeroOneRank, UpdateDuringTheBackwardRefusesAnotherLrAndTakesBackNonFiniteGradients) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TinyEngine t(DType::kBF16, stage, /*update_in_backward=*/true);
    std::vector<float> g(10, 1.0f);
    ASSERT_TRUE(t.e->update_during_backward(1e-3).ok());
    Status twice = t.e->update_during_backward(1e-3);
    EXPECT_EQ(twice.code(), Code::kInvalidInput) << twice.message();
    ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
    Result<StepResult> other = t.e->step(2e-3);
    ASSERT_FALSE(other.ok());
    EXPECT_NE(other.status().message().find("announced lr 0.001"), std::string::npos) << other.status().message();
    // The next step runs whole (the first one's gradient is gone: it counted once).
    ASSERT_TRUE(t.e->update_during_backward(1e-3).ok());
    ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
    Result<StepResult> whole = t.e->step(1e-3);
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    EXPECT_FALSE(whole->update_taken_back);  // no clipping here: the speculation held
    ASSERT_TRUE(t.e->flush().ok());
    EXPECT_GE(t.e->sched_stats().units_updated_in_backward, 1);  // the second step released the unit early
    const std::vector<float> before = t.state();
    g[3] = std::numeric_limits<float>::infinity();
    ASSERT_TRUE(t.e->update_during_backward(1e-3).ok());
    ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
    Result<StepResult> inf = t.e->step(1e-3);
    ASSERT_TRUE(inf.ok()) << inf.status().message();
    EXPECT_FALSE(inf->applied);
    EXPECT_TRUE(inf->update_taken_back);
    ASSERT_TRUE(t.e->flush().ok());
    EXPECT_EQ(t.e->sched_stats().updates_taken_back, 1);
    const std::vector<float> after = t.state();  // master, m, v
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < before.size(); ++i)
      EXPECT_NEAR(after[i], before[i], 1e-6 * std::max(1e-2f, std::fabs(before[i]))) << i;
    // After a step taken back the next update waits for its norm (nothing released early); that
    // norm would have confirmed it, so the one after begins in the backward again.
    g[3] = 1.0f;
    for (int k = 0; k < 2; ++k) {
      const int64_t released = t.e->sched_stats().units_updated_in_backward;
      ASSERT_TRUE(t.e->update_during_backward(1e-3).ok());
      ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
      Result<StepResult> r = t.e->step(1e-3);
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_TRUE(r->applied);
      EXPECT_FALSE(r->update_taken_back);
      ASSERT_TRUE(t.e->flush().ok());
      EXPECT_EQ(t.e->sched_stats().units_updated_in_backward > released, k == 1) << "step " << k;
    }
    // Without the announcement the step is the usual one.
    ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
    EXPECT_TRUE(t.e->step(1e-3).ok());
    EXPECT_TRUE(t.e->flush().ok());
  }
}

// The communication thread runs jobs one at a time in submission order, hands each job's Status
// to its waiter, counts what its communicator sent, and runs what is queued before it stops.
TEST(CommWorker, RunsJobsInOrderAndReturnsEachStatus) {
  auto self = make_self_comm();
  std::vector<int> ran;
  std::vector<float> send(4, 1.5f), recv(4, 0.f);
  uint64_t a, b, c;
  CpuDevice dev(1 << 20, 1 << 20);
  {
    CommWorker w(std::move(*self->duplicate()), dev);
    a = w.submit([&](Comm& cm) {
      ran.push_back(1);
      return cm.reduce_scatter(send.data(), recv.data(), 4, DType::kF32);
    });
    b = w.submit([&](Comm&) {
      ran.push_back(2);
      return Status::Io("second failed");
    });
    c = w.submit([&](Comm&) {
      ran.push_back(3);
      return Status::Ok();
    });
    EXPECT_TRUE(w.wait(a).ok());
    EXPECT_EQ(w.wait(b).message(), "second failed");
    EXPECT_TRUE(w.wait(c).ok());
    EXPECT_EQ(w.take_bytes().total(), 0u);  // one rank puts nothing on the wire
    w.submit([&](Comm&) {
      ran.push_back(4);
      return Status::Ok();
    });
  }  // not waited for: runs before the worker stops
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(recv, send);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
}

// A job that throws on the communication thread fails its own ticket; before, the exception left
// the thread's function and std::terminate ended the process (the other ranks hanging).
TEST(CommWorker, AJobThatThrowsFailsItsTicketAndTheWorkerGoesOn) {
  auto self = make_self_comm();
  CpuDevice dev(1 << 20, 1 << 20);
  CommWorker w(std::move(*self->duplicate()), dev);
  uint64_t a = w.submit([](Comm&) -> Status { throw std::runtime_error("boom"); });
  uint64_t b = w.submit([](Comm&) -> Status { throw std::bad_alloc(); });
  uint64_t c = w.submit([](Comm&) { return Status::Ok(); });
  Status sa = w.wait(a), sb = w.wait(b);
  EXPECT_EQ(sa.code(), Code::kRuntime);
  EXPECT_NE(sa.message().find("boom"), std::string::npos) << sa.message();
  EXPECT_EQ(sb.code(), Code::kOutOfMemory) << sb.message();
  EXPECT_TRUE(w.wait(c).ok());
}

// A failed collective leaves the worker's communicator out of step with the other ranks: the
// jobs after it are not run (a rank that went on would issue collectives nobody matches), and
// their tickets say why. Other failures (a load's) leave the communicator in step.
TEST(CommWorker, NothingRunsAfterAFailedCollective) {
  auto self = make_self_comm();
  CpuDevice dev(1 << 20, 1 << 20);
  CommWorker w(std::move(*self->duplicate()), dev);
  int ran = 0;
  auto count = [&](Comm&) {
    ++ran;
    return Status::Ok();
  };
  const uint64_t io = w.submit([](Comm&) { return Status::Io("a load failed"); });
  const uint64_t after_io = w.submit(count);
  const uint64_t comm = w.submit([](Comm&) { return Status::CommError("NCCL ncclGroupEnd failed on rank 0"); });
  const uint64_t after_comm = w.submit(count);
  EXPECT_EQ(w.wait(io).code(), Code::kIo);
  EXPECT_TRUE(w.wait(after_io).ok());
  EXPECT_EQ(w.wait(comm).code(), Code::kComm);
  const Status skipped = w.wait(after_comm);
  EXPECT_EQ(skipped.code(), Code::kComm);
  EXPECT_NE(skipped.message().find("not run: an earlier collective on the communication thread failed: NCCL "
                                   "ncclGroupEnd"),
            std::string::npos)
      << skipped.message();
  EXPECT_EQ(ran, 1);
}

// Writes every owned element of every kind: state never written reads as zeros without a request
// (NvmeStore), so a test that needs the pass to read from the disk writes it first.
void write_all_owned(Engine& e) {
  for (int u = 0; u < e.num_units(); ++u) {
    const OwnedRange r = e.owned_range(u);
    const std::vector<float> v = random_floats(static_cast<size_t>(r.end - r.begin), 100 + u);
    const std::vector<float> sq(v.size(), 1e-3f);  // exp_avg_sq is never negative
    for (OwnedKind k : {OwnedKind::kMaster, OwnedKind::kExpAvg, OwnedKind::kExpAvgSq})
      ASSERT_TRUE(e.write_owned(u, k, r.begin, r.end, k == OwnedKind::kExpAvgSq ? sq.data() : v.data()).ok());
  }
}

// Stage 3 returns from step() while the optimizer's pass runs on: a pass that fails (here: its
// state's swap files were truncated, so its NVMe reads find the end of the file) is returned by
// flush(); an engine destroyed without asking says so on stderr instead of dropping it.
TEST(ZeroOneRank, AFailedUpdateIsReturnedByFlushOrReportedAtDestruction) {
  const std::string dir = make_temp_dir("failed-update");
  for (bool flush : {true, false}) {
    Config c = with_nvme_offload(mlp_config(3, DType::kF32, 2, 16), dir, 1.0);
    c.offload_param.device = OffloadDevice::kNone;  // the forward needs no swap file
    auto self = make_self_comm();
    CpuDevice dev(c.device_memory_budget, c.host_memory_budget, true);
    MlpModel model(c.n_layer, c.n_embd, 7);
    auto e = std::make_unique<ZeroEngine>(engine_options(c), dev, *self, model.units());
    ASSERT_TRUE(e->allocate().ok());
    write_all_owned(*e);
    int truncated = 0;
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
      if (f.path().extension() == ".swap") truncated += ::truncate(f.path().c_str(), 0) == 0;
    ASSERT_GT(truncated, 0) << "no swap file under " << dir;
    std::vector<float> h0 = random_floats(e->unit(0).numel, 1), h1 = random_floats(e->unit(1).numel, 2);
    Buffer d0 = on_device(dev, h0), d1 = on_device(dev, h1);
    ASSERT_TRUE(e->grads_ready(1, d1.as<float>()).ok());
    ASSERT_TRUE(e->grads_ready(0, d0.as<float>()).ok());
    ASSERT_TRUE(e->step(1e-3).ok()) << "stage 3 returns before its update";
    testing::internal::CaptureStderr();
    if (flush) {
      Result<StepResult> r = e->flush();
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), Code::kIo) << r.status().message();
    }
    e.reset();
    std::string err = testing::internal::GetCapturedStderr();
    if (flush) EXPECT_EQ(err, "") << "flush() returned the error: nothing left to report";
    else EXPECT_NE(err.find("last optimizer update failed"), std::string::npos) << err;
    for (Buffer* b : {&d0, &d1}) dev.free(*b);
  }
}

// The NVMe tier's environment reaches the engine from its creation: a read and a write that fail
// in the middle of a step (the optimizer's pass reading the state, its write-back) come back as
// the documented error, one Status naming the swap file, the operation and the errno.
TEST(ZeroOneRank, NvmeFaultsMidStepAreTheStoresErrorThroughTheEngine) {
  const std::string dir = make_temp_dir("engine-faults");
  for (IoOp op : {IoOp::kRead, IoOp::kWrite}) {
    Config c = with_nvme_offload(mlp_config(3, DType::kF32, 2, 16), dir, 1.0);
    auto self = make_self_comm();
    CpuDevice dev(c.device_memory_budget, c.host_memory_budget, true);
    MlpModel model(c.n_layer, c.n_embd, 3);
    FaultInjectingEnv env(NvmeEnv::Default());
    auto made = ZeroEngine::create(engine_options(c), dev, *self, model.units(), &env);
    ASSERT_TRUE(made.ok()) << made.status().message();
    Engine& e = **made;
    write_all_owned(e);
    std::vector<float> h0 = random_floats(e.unit(0).numel, 1), h1 = random_floats(e.unit(1).numel, 2);
    Buffer d0 = on_device(dev, h0), d1 = on_device(dev, h1);
    ASSERT_TRUE(e.grads_ready(1, d1.as<float>()).ok());
    ASSERT_TRUE(e.grads_ready(0, d0.as<float>()).ok());
    env.fail_requests(op, env.requests(op) + 1, op == IoOp::kRead ? EIO : ENOSPC);  // the next one
    Status st = e.step(1e-3).status();
    if (st.ok()) st = e.flush().status();  // stage 3: the pass runs on after step() returns
    ASSERT_FALSE(st.ok()) << "the injected fault was not seen";
    EXPECT_EQ(st.code(), Code::kIo) << st.message();
    EXPECT_NE(st.message().find(".swap"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(op == IoOp::kRead ? "read" : "write"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(std::strerror(op == IoOp::kRead ? EIO : ENOSPC)), std::string::npos) << st.message();
    for (Buffer* b : {&d0, &d1}) dev.free(*b);
  }
}

// What allocate() says for the MLP test model under config c, on one rank.
Status allocate_mlp(const Config& c) {
  auto self = make_self_comm();
  CpuDevice dev(c.device_memory_budget, c.host_memory_budget, true);
  MlpModel model(c.n_layer, c.n_embd, 1);
  ZeroEngine e(engine_options(c), dev, *self, model.units());
  return e.allocate();
}

TEST(ZeroOneRank, AUnitThatCannotFitIsAnErrorAtStartUp) {
  Config c = mlp_config(3, DType::kBF16);
  c.offload_param.device = c.offload_optimizer.device = OffloadDevice::kCpu;
  // Nothing persistent is on the device (the gradient shard follows the optimizer to the host); a
  // unit in flight (10.7 KB) still does not fit.
  c.device_memory_budget = 8192;
  Status st = allocate_mlp(c);
  EXPECT_EQ(st.code(), Code::kInvalidInput);
  EXPECT_NE(st.message().find("unit 'layers.0' in flight 10664 bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("zoe.device_memory_budget"), std::string::npos) << st.message();
}

// The state an offloaded optimizer puts in host memory (the fp32 master and moments, 12 bytes an
// element of the shard, and the bf16 gradient shard beside them, 2: 14 x 6665 = 93310 bytes) does
// not fit a 4 KiB host budget: a bad config before anything is allocated, naming what would fit.
TEST(ZeroOneRank, AHostBudgetTooSmallForTheOffloadedStateIsABadConfigNamingWhatFits) {
  Config c = mlp_config(3, DType::kBF16);
  c.offload_optimizer.device = OffloadDevice::kCpu;
  c.host_memory_budget = 4096;
  Status st = allocate_mlp(c);
  EXPECT_EQ(st.code(), Code::kInvalidInput);
  const std::string& m = st.message();
  EXPECT_NE(m.find("config key 'zoe.host_memory_budget' (4096 bytes (4.0 KiB)): too small for this model: the state "
                   "it puts in host memory needs 93310 bytes (91.1 KiB); it would fit with zoe.host_memory_budget "
                   "93310 bytes (91.1 KiB) or more"),
            std::string::npos) << m;
  // The optimizer on NVMe would still keep the gradient shard (13330 bytes) in host memory: not offered.
  EXPECT_EQ(m.find("nvme"), std::string::npos) << m;
  EXPECT_NE(m.find(" ranks (needs "), std::string::npos) << m;
}

TEST(ZeroOneRank, Fp16OverflowSkipsTheStepLowersTheScaleAndTouchesNothing) {
  TinyEngine t(DType::kF16);
  EXPECT_EQ(t.e->loss_scale(), 65536.0);  // 2^initial_scale_power (16)
  std::vector<float> g(10, 1.0f);
  ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
  ASSERT_TRUE(t.e->step(1e-3).ok());  // one good step so the state is not all zeros
  auto before = t.state();
  g[3] = std::numeric_limits<float>::infinity();
  // hysteresis 2: the first overflow is absorbed, the second halves the scale
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
    auto r = t.e->step(1e-3);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->applied);
    EXPECT_EQ(r->step, 1);
  }
  EXPECT_EQ(t.e->loss_scale(), 32768.0);
  EXPECT_EQ(before, t.state());
  EXPECT_EQ(t.e->steps_applied(), 1);
}

TEST(ZeroOneRank, Bf16NaNGradientSkipsTheStep) {
  TinyEngine t(DType::kBF16, 0);
  std::vector<float> g(10, 1.0f);
  g[9] = std::numeric_limits<float>::quiet_NaN();
  auto before = t.state();
  ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
  auto r = t.e->step(1e-3);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->applied);
  EXPECT_EQ(before, t.state());
  EXPECT_EQ(t.e->loss_scale(), 1.0);
}

TEST(ZeroOneRank, ClippingScalesGradientsToTheMaxNorm) {
  // Adam's first moment after one step is (1 - beta1) * g: it shows the gradient actually used.
  for (double clip : {0.0, 1.0}) {
    TinyEngine t(DType::kF32, 2);
    t.e.reset();
    t.c.grad_clip = clip;
    t.e = std::make_unique<ZeroEngine>(engine_options(t.c), t.dev, *t.comm, std::vector<UnitSpec>{make_unit("u", {{"w", {2, 5}}})});
    ASSERT_TRUE(t.e->allocate().ok());
    std::vector<float> g(10, 3.0f);
    ASSERT_TRUE(grads_from_host(*t.e, 0, g.data()).ok());
    auto r = t.e->step(1e-3);
    ASSERT_TRUE(r.ok());
    double norm = 3.0 * std::sqrt(10.0);
    EXPECT_NEAR(r->grad_norm, norm, 1e-9);
    double used = clip > 0 ? 3.0 * clip / (norm + 1e-6) : 3.0;
    float m4 = 0;
    ASSERT_TRUE(t.e->read_owned(0, OwnedKind::kExpAvg, 4, 5, &m4).ok());
    EXPECT_NEAR(m4, 0.1 * used, 1e-7) << "clip " << clip;
  }
}

TEST(LossScaler, GrowsAfterAWindowOfGoodSteps) {
  LossScaler s = LossScaler::dynamic(4, 3, 1, 1.0);
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 16.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 32.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 16.0);
  for (int i = 0; i < 10; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 1.0);  // min_loss_scale
}

TEST(MlpModel, BackwardMatchesFiniteDifferences) {
  MlpModel m(3, 6, 5);
  CaptureEngine e(m.units());
  for (int u = 0; u < e.num_units(); ++u) {
    std::vector<float> v(e.unit(u).numel);
    m.init_unit(u, 7, v.data());
    ASSERT_TRUE(e.set_params(u, v.data()).ok());
  }
  Batch b;
  b.B = 3;
  b.first_sample = 11;
  ASSERT_TRUE(m.train_micro_step(e, b, 1.0f).ok());
  for (int u = 0; u < e.num_units(); ++u) {
    for (int64_t i = 0; i < e.unit(u).numel; i += 5) {
      float keep = e.params_[u][i];
      const float h = 1e-2f;
      auto eval_at = [&](float v) {
        e.params_[u][i] = v;
        EXPECT_TRUE(e.set_params(u, e.params_[u].data()).ok());  // onto the device
        return m.eval_loss(e, b).value();
      };
      double lp = eval_at(keep + h), lm = eval_at(keep - h);
      eval_at(keep);
      double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(e.grads_[u][i], fd, 2e-4 + 2e-2 * std::abs(fd)) << "unit " << u << " element " << i;
    }
  }
}

// Every optimizer step's lr as DeepSpeed 0.19.8's own WarmupLR / WarmupCosineLR give it when its
// engine steps them (tools/gen_lr_golden.py wrote tests/data/lr_golden.json): step 1 runs at
// iteration -1, so warm-up starts one step later than a naive schedule.
TEST(LrSchedule, EveryStepMatchesDeepSpeedsSchedulers) {
  std::ifstream f(std::string(ZOE_SOURCE_DIR) + "/tests/data/lr_golden.json");
  ASSERT_TRUE(f.good()) << "missing tests/data/lr_golden.json (tools/gen_lr_golden.py writes it)";
  nlohmann::json g = nlohmann::json::parse(f);
  ASSERT_GE(g["cases"].size(), 5u);
  for (const auto& kase : g["cases"]) {
    nlohmann::json cfg = {{"optimizer", {{"params", {{"lr", kase["lr"]}}}}},
                          {"scheduler", {{"type", kase["type"]}, {"params", kase["params"]}}}};
    auto c = parse_config(cfg.dump(), {}, "golden");
    ASSERT_TRUE(c.ok()) << c.status().message();
    const auto& want = kase["lrs"];
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(lr_at(*c, static_cast<int64_t>(s)), want[s].get<double>(), 1e-15 + 1e-12 * want[s].get<double>())
          << kase["type"] << " " << kase["params"].dump() << " optimizer step " << s + 1;
  }
}

}  // namespace
}  // namespace zoe::test

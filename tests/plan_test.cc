// `zoe plan`'s step model and search against hand-computed cases: the ledger's bytes per tier to
// the byte, times from given rates, stage 3's loads through the scheduler on the virtual clock,
// refusals with their reason, and the search's choice on a toy machine.
#include <gtest/gtest.h>

#include <set>

#include "plan/plan_search.h"
#include "plan/step_model.h"

namespace zoe {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// n units of `elems`, each computing fwd then 2x fwd backward: forward in unit order, backward reversed.
MicroStepWork work(int n, double fwd, uint64_t acts = 0, int64_t tokens = 1024) {
  MicroStepWork w;
  for (int u = 0; u < n; ++u) w.fetches.push_back({u, fwd, false});
  for (int u = n - 1; u >= 0; --u) w.fetches.push_back({u, 2 * fwd, true});
  w.activation_bytes = acts;
  w.tokens = tokens;
  return w;
}

// A job of `units` on one rank with roomy budgets and an NVMe path.
PlanJob roomy(std::vector<int64_t> units) {
  PlanJob job;
  job.unit_elems = std::move(units);
  job.device_budget = 8 * kGiB;
  job.host_budget = 16 * kGiB;
  job.nvme_free = 100 * kGiB;
  return job;
}

PlanRates rates() {
  PlanRates r;
  r.adam_elems_per_s = 1e9;
  r.nvme_read_Bps = 2e9;
  r.nvme_write_Bps = 1e9;
  r.host_copy_Bps = 1e10;
  r.gather_busbw_Bps = r.reduce_busbw_Bps = 1e9;
  return r;
}

TEST(StepModel, StateBytesPerTierAreTheLedgersToTheByte) {
  PlanJob job;
  job.unit_elems = {1000, 3001};  // chunks of 500 and 1501 at 2 ranks: S = 2001, P_pad = 4002
  job.ranks = 2;
  job.dtype = DType::kBF16;
  PlanKnobs k;
  k.stage = 3;
  k.optimizer = OffloadDevice::kNvme;
  k.param = OffloadDevice::kCpu;
  k.param_ratio = 0.5;  // llround(1000.5) = 1001 of the shard's parameters in host memory
  auto b = state_bytes(job, k);
  EXPECT_EQ(b[0], (2001 - 1001) * 2u);       // parameters on the device
  EXPECT_EQ(b[1], 1001 * 2u + 2001 * 2u);    // parameters, and the sharded gradients beside the optimizer
  EXPECT_EQ(b[2], 2001 * 12u);               // master, exp_avg, exp_avg_sq
  k.stage = 1;                               // optimizer sharded only; replicated weights and gradients
  k.param = OffloadDevice::kNone;
  k.optimizer = OffloadDevice::kCpu;
  k.optimizer_ratio = 0.25;
  b = state_bytes(job, k);
  EXPECT_EQ(b[0], 4002 * 2u + 4002 * 2u + (2001 - 500) * 12u);  // llround(500.25) = 500 offloaded
  EXPECT_EQ(b[1], 500 * 12u);
  EXPECT_EQ(b[2], 0u);
  job.dtype = DType::kF32;                   // fp32: no separate master
  k.stage = 0;
  k.optimizer = OffloadDevice::kNone;
  EXPECT_EQ(state_bytes(job, k)[0], 4002 * (4u + 4u + 8u));
}

// At 2+ ranks the communicator that reduces holds one largest reduction's staging from start-up
// (ZeroEngine::reserve_staging): size() chunks of the largest unit in the gradient dtype, in host
// memory over MPI (rounded to 64 bytes), on the device for NCCL's rank-order sum, nowhere for
// NCCL's own reduce-scatter; one rank reduces without it.
TEST(StepModel, TheReductionsStagingIsCountedWhereTheCommunicatorHoldsIt) {
  PlanJob job = roomy({1000, 3001});  // chunks of 500 and 1501 at 2 ranks
  job.ranks = 2;
  PlanKnobs k;
  k.stage = 3;
  job.staging = std::nullopt;
  const StepPrediction none = predict_step(job, k, work(2, 0.1), rates());
  ASSERT_TRUE(none.fits) << none.why;
  job.staging = Tier::kHost;
  const StepPrediction host = predict_step(job, k, work(2, 0.1), rates());
  EXPECT_EQ(host.bytes[0], none.bytes[0]);
  EXPECT_EQ(host.bytes[1], none.bytes[1] + 6016);  // 1501 x 2 ranks x 2 bytes = 6004, rounded
  job.staging = Tier::kDevice;
  const StepPrediction device = predict_step(job, k, work(2, 0.1), rates());
  EXPECT_EQ(device.bytes[0], none.bytes[0] + 6004);
  EXPECT_EQ(device.bytes[1], none.bytes[1]);
  job.ranks = 1;
  const StepPrediction one = predict_step(job, k, work(2, 0.1), rates());
  job.staging = std::nullopt;
  EXPECT_EQ(one.bytes, predict_step(job, k, work(2, 0.1), rates()).bytes);
}

// At stages 2-3 with overlap_comm the engine reduces on a communication thread whose second
// reduction buffer (the largest unit's gradient) joins the reserve (ZeroEngine::start_comm_worker);
// where the device cannot hold it beside the rest, the engine reduces without the thread, and the
// job still fits.
TEST(StepModel, TheCommunicationThreadsBufferIsCountedWhereItFits) {
  PlanJob job = roomy({1000, 3001});  // the largest unit: 3002 elements padded at 2 ranks
  job.ranks = 2;
  job.staging = std::nullopt;
  PlanKnobs k;
  k.stage = 3;
  job.overlap_comm = false;
  const StepPrediction without = predict_step(job, k, work(2, 0.1, 1000), rates());
  ASSERT_TRUE(without.fits) << without.why;
  job.overlap_comm = true;
  const StepPrediction with = predict_step(job, k, work(2, 0.1, 1000), rates());
  EXPECT_EQ(with.bytes[0], without.bytes[0] + 3002 * 2);
  EXPECT_EQ(with.bytes[1], without.bytes[1]);
  job.device_budget = with.bytes[0] - 1;  // no room for the thread's buffer: it fits without
  const StepPrediction tight = predict_step(job, k, work(2, 0.1, 1000), rates());
  EXPECT_TRUE(tight.fits) << tight.why;
  EXPECT_EQ(tight.bytes[0], without.bytes[0]);
  job.device_budget = with.bytes[0];
  EXPECT_EQ(predict_step(job, k, work(2, 0.1, 1000), rates()).bytes[0], with.bytes[0]);
  k.stage = 1;  // replicated gradients reduce at the step, on the caller's thread
  job.device_budget = 8 * kGiB;
  const StepPrediction s1 = predict_step(job, k, work(2, 0.1, 1000), rates());
  job.overlap_comm = false;
  EXPECT_EQ(s1.bytes, predict_step(job, k, work(2, 0.1, 1000), rates()).bytes);
}

TEST(StepModel, AResidentStepIsItsMicroStepsAndAdam) {
  PlanJob job;
  job.unit_elems = {1'000'000, 1'000'000};
  job.device_budget = 8 * kGiB;
  PlanKnobs k;  // stage 0, nothing offloaded
  k.accumulation = 2;
  const StepPrediction p = predict_step(job, k, work(2, 0.1), rates());
  ASSERT_TRUE(p.fits) << p.why;
  EXPECT_DOUBLE_EQ(p.compute_s, 2 * 0.6);
  EXPECT_NEAR(p.micro_s, 2 * 0.6, 1e-12);  // one rank: the hand-over is in the measured micro-step
  EXPECT_NEAR(p.optimizer_s, 2e6 / 1e9, 1e-12);
  EXPECT_NEAR(p.step_s, p.micro_s + p.optimizer_s, 1e-12);
  EXPECT_NEAR(p.tokens_per_s, 2 * 1024 / p.step_s, 1e-9);
  EXPECT_EQ(p.bound, "compute");
  // Device: the state (16 bytes an element), the largest unit in flight (its fp32 gradient), the activations.
  EXPECT_EQ(p.bytes[0], 2'000'000u * 16 + 1'000'000u * 4);
}

TEST(StepModel, TheOptimizerOnNvmeStreamsTwelveBytesAnElementEachWay) {
  const PlanJob job = roomy({1'000'000, 1'000'000});
  PlanKnobs k;
  k.stage = 2;
  k.optimizer = OffloadDevice::kNvme;
  k.sub_group_size = 500'000;
  const StepPrediction p = predict_step(job, k, work(2, 0.001), rates());
  ASSERT_TRUE(p.fits) << p.why;
  const double disk = 2e6 * 12 / 2e9 + 2e6 * 12 / 1e9;  // read and write back master, m, v
  EXPECT_NEAR(p.disk_s, disk, 1e-12);
  EXPECT_NEAR(p.optimizer_s, disk + 5e5 * 12 / 2e9, 1e-12);  // and the first window's read ahead of Adam
  EXPECT_EQ(p.bound, "disk");
  EXPECT_EQ(p.bytes[2], 2'000'000u * 12);
  EXPECT_GT(p.bytes[1], 2'000'000u * 2);  // the gradients and the pinned pool
  // The pass measured through the engine (reads and write-backs at once) replaces the rates' sum.
  PlanRates measured = rates();
  measured.nvme_pass_s_per_elem = 30e-9;
  const StepPrediction q = predict_step(job, k, work(2, 0.001), measured);
  EXPECT_NEAR(q.disk_s, 2e6 * 30e-9, 1e-12);
  // Sub-groups end where a unit ends: with a sub-group larger than the state, the first window is
  // the first unit's state (a 200 K-element embedding here), not all of it.
  const PlanJob units = roomy({200'000, 1'000'000, 1'000'000});
  k.sub_group_size = 1'000'000'000;
  const StepPrediction f = predict_step(units, k, work(3, 0.001), rates());
  ASSERT_TRUE(f.fits) << f.why;
  EXPECT_NEAR(f.optimizer_s, f.disk_s + 2e5 * 12 / 2e9, 1e-12);
}

TEST(StepModel, StageThreeHidesNvmeParameterLoadsBehindComputeWhenItPrefetches) {
  const PlanJob job = roomy(std::vector<int64_t>(8, 1'000'000));
  PlanKnobs k;
  k.stage = 3;
  k.param = OffloadDevice::kNvme;
  PlanRates r = rates();
  r.host_copy_Bps = 1e15;  // the device part of no chunk to speak of
  // A load takes 1e6 * 2 / 2e9 = 1 ms; a unit's forward 1 ms, its backward 2 ms.
  k.prefetch = {0, 1'000'000'000, 0};  // no prefetch, no reuse: load, compute, load, ...
  const StepPrediction serial = predict_step(job, k, work(8, 0.001), r);
  ASSERT_TRUE(serial.fits) << serial.why;
  EXPECT_NEAR(serial.micro_s, 16 * 0.001 + 24 * 0.001, 1e-12);
  k.prefetch = {2'000'000, 1'000'000'000, 1'000'000'000};  // ahead, and kept for the backward
  const StepPrediction ahead = predict_step(job, k, work(8, 0.001), r);
  EXPECT_NEAR(ahead.micro_s, 0.001 + 24 * 0.001, 1e-12);  // the first load, then compute only
  EXPECT_LT(ahead.disk_s, serial.disk_s);                  // kept units are not read again
}

// A GPU beside the host: its own Adam, a link each way, copies within its memory.
PlanRates gpu_rates() {
  PlanRates r = rates();
  r.compute_on_host_cores = false;
  r.device_adam_elems_per_s = 1e11;
  r.h2d_Bps = 5e10;
  r.d2h_Bps = 4e10;
  r.device_copy_Bps = 1e12;
  return r;
}

TEST(StepModel, OnAGpuTheHostsAdamPaysTheLinkAndCanRunBesideTheBackward) {
  const PlanJob job = roomy({1'000'000, 1'000'000});  // bf16: 2-byte gradients and weights
  PlanRates r = gpu_rates();
  PlanKnobs k;  // stage 0, resident: the GPU's Adam
  StepPrediction p = predict_step(job, k, work(2, 0.001), r);
  ASSERT_TRUE(p.fits) << p.why;
  EXPECT_NEAR(p.optimizer_s, 2e6 / 1e11, 1e-15);
  MicroStepWork launches = work(2, 0.001);
  launches.step_overhead_per_unit_s = 1e-4;  // and what each unit's launches cost a step
  EXPECT_NEAR(predict_step(job, k, launches, r).optimizer_s, 2e6 / 1e11 + 2e-4, 1e-15);
  // The optimizer in host memory: each sub-group's gradients come down, Adam on the CPU, the
  // weights go back up, in turn.
  k.optimizer = OffloadDevice::kCpu;
  const double per = 1 / 1e9 + 2 / 4e10 + 2 / 5e10;
  p = predict_step(job, k, work(2, 0.001), r);
  EXPECT_NEAR(p.optimizer_s, 2e6 * per, 1e-12);
  EXPECT_NEAR(p.step_s, 0.006 + 2e6 * per, 1e-12);
  // Half of it: the device's half on the GPU.
  k.optimizer_ratio = 0.5;
  p = predict_step(job, k, work(2, 0.001), r);
  EXPECT_NEAR(p.optimizer_s, 1e6 / 1e11 + 1e6 * per, 1e-12);
  // Beside the backward (4 ms): hidden while shorter, else the step is the forward and the pass.
  k.optimizer_ratio = 1;
  k.update_in_backward = true;
  p = predict_step(job, k, work(2, 0.001), r);
  EXPECT_NEAR(p.step_s, 0.006, 1e-12);
  r.adam_elems_per_s = 1e8;
  const double slow = 2e6 * (1 / 1e8 + 2 / 4e10 + 2 / 5e10);
  p = predict_step(job, k, work(2, 0.001), r);
  EXPECT_NEAR(p.step_s, 0.002 + slow, 1e-12);
  EXPECT_EQ(p.bound, "optimizer");
  // On the CPU device the pass and the backward share the cores: no overlap there.
  PlanRates cpu = rates();
  cpu.adam_elems_per_s = 1e8;
  p = predict_step(job, k, work(2, 0.001), cpu);
  EXPECT_NEAR(p.step_s, 0.006 + 2e6 / 1e8, 1e-12);
  // Stage 2: the gradients go down at their hand-over, beside the backward; the pass takes only
  // the weights back up.
  k.stage = 2;
  k.update_in_backward = false;
  r = gpu_rates();
  p = predict_step(job, k, work(2, 0.001), r);
  EXPECT_NEAR(p.micro_s, 0.006, 1e-12);  // 2e6 x 2 bytes at 40 GB/s: 0.1 ms under the 4 ms backward
  EXPECT_NEAR(p.optimizer_s, 2e6 * (1 / 1e9 + 2 / 5e10), 1e-12);
  // A backward (4 us) too short to hide them: the forward, then the copies.
  p = predict_step(job, k, work(2, 1e-6), r);
  EXPECT_NEAR(p.micro_s, 2e-6 + 2e6 * 2 / 4e10, 1e-12);
}

TEST(StepModel, OnAGpuStageThreesHostLoadsCrossTheLinkBesideTheCompute) {
  const PlanJob job = roomy(std::vector<int64_t>(8, 1'000'000));
  PlanKnobs k;
  k.stage = 3;
  k.param = OffloadDevice::kCpu;
  k.prefetch = {2'000'000, 1'000'000'000, 1'000'000'000};
  PlanRates gpu = gpu_rates();
  gpu.h2d_Bps = 2e9;  // a load: 1e6 x 2 bytes at 2 GB/s, 1 ms; a unit's forward 1 ms
  const StepPrediction g = predict_step(job, k, work(8, 0.001), gpu);
  ASSERT_TRUE(g.fits) << g.why;
  EXPECT_NEAR(g.micro_s, 0.001 + 24 * 0.001, 1e-12);  // the first load, then compute only
  // The same copies on the CPU device take turns with its compute on the same cores.
  PlanRates cpu = rates();
  cpu.host_copy_Bps = 2e9;
  const StepPrediction c = predict_step(job, k, work(8, 0.001), cpu);
  EXPECT_GT(c.micro_s, g.micro_s + 0.007);
}

TEST(StepModel, WhatDoesNotFitIsRefusedNamingTheTierAndTheBytes) {
  PlanJob job;
  job.unit_elems = {1'000'000};
  job.device_budget = 10'000'000;  // 16 MB of state does not fit
  PlanKnobs k;
  StepPrediction p = predict_step(job, k, work(1, 0.01), rates());
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.why.find("device"), std::string::npos) << p.why;
  k.optimizer = OffloadDevice::kNvme;  // no NVMe path in the job
  p = predict_step(job, k, work(1, 0.01), rates());
  EXPECT_NE(p.why.find("no nvme_path"), std::string::npos) << p.why;
}

TEST(PlanSearch, OnAToyMachineTheFastestFittingPlanWins) {
  // 16 M parameters in 8 units; the device holds 100 MB: the full state (256 MB) does not fit.
  PlanJob job = roomy(std::vector<int64_t>(8, 2'000'000));
  job.device_budget = 100'000'000;
  PlanSpace space;
  space.sequences_per_rank = 4;
  space.nvme = true;
  // Compute per micro-batch: 5 ms fixed plus 10 ms a sequence per unit; activations 10 MB a
  // sequence (20 MB with checkpointing off), so micro-batches of 4 without checkpointing do not fit.
  auto micro = [](int b, bool ckpt) -> Result<MicroStepWork> {
    return work(8, 0.005 + 0.01 * b * (ckpt ? 1.3 : 1.0), uint64_t(b) * (ckpt ? 10'000'000 : 20'000'000), 256 * b);
  };
  auto r = search_plans(job, space, micro, rates());
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->fitting.empty());
  const PlanChoice& best = r->fitting.front();
  // Host memory is plenty and faster than the disk: the optimizer goes there, all of it.
  EXPECT_EQ(best.knobs.optimizer, OffloadDevice::kCpu);
  EXPECT_LE(best.prediction.bytes[0], job.device_budget);
  for (const PlanChoice& c : r->fitting) EXPECT_GE(c.prediction.step_s, best.prediction.step_s * 0.99);
  bool refused_device = false;
  for (const PlanChoice& c : r->refused)
    refused_device |= c.knobs.stage == 0 && c.knobs.optimizer == OffloadDevice::kNone &&
                      c.prediction.why.find("device") != std::string::npos;
  EXPECT_TRUE(refused_device);
  // A host budget too small for the optimizer state leaves the disk.
  job.host_budget = 64'000'000;
  r = search_plans(job, space, micro, rates());
  ASSERT_TRUE(r.ok() && !r->fitting.empty());
  EXPECT_EQ(r->fitting.front().knobs.optimizer, OffloadDevice::kNvme);
}

// A micro-batch the GPU had no room for when measured is refused with that reason; the rest are
// planned, and any other measuring failure ends the search.
TEST(PlanSearch, AMicroStepOutOfDeviceMemoryIsRefusedNotFatal) {
  const PlanJob job = roomy(std::vector<int64_t>(4, 1'000'000));
  PlanSpace space;
  space.sequences_per_rank = 4;
  auto micro = [](int b, bool ckpt) -> Result<MicroStepWork> {
    if (b == 4 && !ckpt) return Status::OutOfMemory("device memory budget exhausted");
    return work(4, 0.001 * b, 1'000'000, 256 * b);
  };
  auto r = search_plans(job, space, micro, rates());
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->fitting.empty());
  int refused = 0;
  for (const PlanChoice& c : r->refused)
    if (c.knobs.micro_batch == 4 && !c.knobs.activation_checkpointing) {
      ++refused;
      EXPECT_NE(c.prediction.why.find("out of device memory when measured"), std::string::npos) << c.prediction.why;
    }
  EXPECT_GT(refused, 0);
  for (const PlanChoice& c : r->fitting) EXPECT_FALSE(c.knobs.micro_batch == 4 && !c.knobs.activation_checkpointing);
  auto broken = [](int, bool) -> Result<MicroStepWork> { return Status::Io("the profiler's file"); };
  EXPECT_FALSE(search_plans(job, space, broken, rates()).ok());
}

// Nothing fits: each kind of change is the least that makes something fit (a byte less, or half
// the ranks, fits nothing), and applying it alone gives the configuration it names.
TEST(PlanSearch, AJobThatFitsNothingGetsTheSmallestChangeOfEachKind) {
  PlanJob job = roomy(std::vector<int64_t>(8, 2'000'000));  // 16 M parameters: 256 MB of state
  job.device_budget = 30'000'000;
  job.host_budget = 60'000'000;
  job.nvme_free = 0;  // no NVMe path
  PlanSpace space;
  space.sequences_per_rank = 2;
  auto micro = [](int b, bool ckpt) -> Result<MicroStepWork> {
    return work(8, 0.005 * b, uint64_t(b) * (ckpt ? 2'000'000 : 4'000'000), 256 * b);
  };
  auto fits = [&](const PlanJob& j, const PlanSpace& sp) {
    auto r = search_plans(j, sp, micro, rates());
    EXPECT_TRUE(r.ok());
    return r.ok() && !r->fitting.empty();
  };
  ASSERT_FALSE(fits(job, space));
  auto now = search_plans(job, space, micro, rates());
  ASSERT_TRUE(now.ok());
  auto changes = smallest_changes(job, space, micro, rates(), *now);
  ASSERT_TRUE(changes.ok()) << changes.status().message();
  std::set<PlanChange::Kind> kinds;
  for (const PlanChange& ch : *changes) {
    kinds.insert(ch.kind);
    PlanJob j = job, less = job;
    PlanSpace sp = space;
    switch (ch.kind) {
      case PlanChange::Kind::kDeviceBudget: j.device_budget = ch.value, less.device_budget = ch.value - 1; break;
      case PlanChange::Kind::kHostBudget: j.host_budget = ch.value, less.host_budget = ch.value - 1; break;
      case PlanChange::Kind::kNvme:
        sp.nvme = true, j.nvme_free = ch.value, less.nvme_free = ch.value - 1;
        EXPECT_TRUE(ch.choice.knobs.optimizer == OffloadDevice::kNvme || ch.choice.knobs.param == OffloadDevice::kNvme);
        break;
      case PlanChange::Kind::kRanks:
        j.ranks = int(ch.value), less.ranks = int(ch.value) / 2;
        EXPECT_EQ(ch.choice.knobs.stage, 3);  // only stage 3 shrinks every tier with more ranks
        break;
    }
    EXPECT_TRUE(fits(j, sp)) << int(ch.kind) << " " << ch.value;
    EXPECT_FALSE(fits(less, sp)) << int(ch.kind) << " " << ch.value;
    EXPECT_TRUE(ch.choice.prediction.fits);
  }
  // Each kind applies here: 256 MB of state over a 30 MB device and a 60 MB host.
  EXPECT_EQ(kinds.size(), 4u);
}

TEST(PlanSearch, TheGridPairsKnobsThatMeanSomethingTogether) {
  PlanSpace s;
  s.sequences_per_rank = 6;
  s.nvme = false;
  for (const PlanKnobs& k : plan_grid(s)) {
    EXPECT_EQ(k.micro_batch * k.accumulation, 6);
    if (k.stage < 3) { EXPECT_EQ(k.param, OffloadDevice::kNone); }
    if (k.optimizer == OffloadDevice::kNone) { EXPECT_EQ(k.optimizer_ratio, 1.0); }
    EXPECT_NE(k.optimizer, OffloadDevice::kNvme);
    EXPECT_FALSE(k.update_in_backward);  // offered on a GPU only
  }
  const std::vector<PlanKnobs> grid = plan_grid(s);
  size_t repeats = 0;  // no setting of the knobs twice
  for (size_t i = 0; i < grid.size(); ++i)
    for (size_t j = i + 1; j < grid.size(); ++j) repeats += grid[i] == grid[j];
  EXPECT_EQ(repeats, 0u);
  s.update_in_backward = {false, true};
  int early = 0;
  for (const PlanKnobs& k : plan_grid(s))
    if (k.update_in_backward) {
      ++early;
      EXPECT_LT(k.stage, 3);  // stage 3's pass already runs beside the next forward
      EXPECT_NE(k.optimizer, OffloadDevice::kNone);
    }
  EXPECT_GT(early, 0);
}

}  // namespace
}  // namespace zoe

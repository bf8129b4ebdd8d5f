#include "engine_harness.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "sched/zero_engine.h"
#include "test_util.h"
#include "train/backend.h"
#include "train/engine_options.h"

namespace zoe::test {

// Whether a step's reductions run on the communication thread: at one rank the first reduction of
// a unit a step is the conversion into the owned chunk at the hand-over (GradReducer::reduce_alone),
// so only later micro-steps' go there.
static bool reductions_on_thread(const Comm& control, int grad_accum) {
  return control.size() > 1 || grad_accum > 1;
}

Result<TestDevice> make_test_device(size_t device_budget, size_t host_budget, Comm& control) {
  Config c;
  c.device = test_device_name();
  c.device_memory_budget = device_budget;
  c.host_memory_budget = host_budget;
  ZOE_ASSIGN_OR_RETURN(Backend b, make_backend(c, control));
  TestDevice t;
  t.device = std::move(b.device);
  t.tensor_comm = std::move(b.tensor_comm);
  t.comm = t.tensor_comm ? t.tensor_comm.get() : &control;
  return t;
}

Result<MlpRun> run_mlp(const Config& c, Comm& comm, int steps, bool flush_each_step) {
  MlpModel model(c.n_layer, c.n_embd, 99);
  auto source = make_synthetic_source(c.micro_batch, comm.rank(), comm.size());
  return run_model(c, comm, steps, model, *source, flush_each_step);
}

Result<std::vector<float>> all_params(Engine& e) {
  std::vector<float> all;
  for (int u = 0; u < e.num_units(); ++u) {
    size_t at = all.size();
    all.resize(at + e.unit(u).numel);
    ZOE_RETURN_IF_ERROR(fetch_to_host(e, u, all.data() + at));
  }
  return all;
}

Result<MlpRun> run_model(const Config& c, Comm& control, int steps, Model& model, BatchSource& source,
                         bool flush_each_step) {
  ZOE_ASSIGN_OR_RETURN(TestDevice td, make_test_device(c.device_memory_budget, c.host_memory_budget, control));
  Device& dev = *td.device;
  Comm& comm = *td.comm;
  // Communication staging is booked in this run's ledger, and unbooked before the ledger goes.
  comm.set_ledger(&dev.ledger());
  struct Unbook {
    Comm& c;
    ~Unbook() { c.set_ledger(nullptr); }
  } unbook{comm};
  auto units = model.units();
  ZeroEngine engine(engine_options(c), dev, comm, units);
  ZOE_RETURN_IF_ERROR(engine.allocate());
  MlpRun run;
  run.at_start = dev.ledger().snapshot();
  ZOE_RETURN_IF_ERROR(init_params(engine, model, c.seed));
  run.padded = engine.layout().padded_params();
  run.shard = engine.layout().shard_size();
  for (int u = 0; u < engine.num_units(); ++u)
    run.largest_chunk = std::max(run.largest_chunk, engine.layout().slot(u).chunk);
  for (int s = 0; s < steps; ++s) {
    comm.reset_counters();
    double loss = 0;
    for (int m = 0; m < c.grad_accum; ++m) {
      ZOE_ASSIGN_OR_RETURN(Batch b, source.next());
      if (m == c.grad_accum - 1) ZOE_RETURN_IF_ERROR(engine.update_during_backward(c.lr));  // zoe.update_in_backward
      ZOE_ASSIGN_OR_RETURN(double l, model.train_micro_step(engine, b, static_cast<float>(engine.loss_scale())));
      loss += l;
    }
    ZOE_ASSIGN_OR_RETURN(StepResult r, engine.step(c.lr));
    run.skipped += !r.applied;
    run.taken_back += r.update_taken_back;
    if (flush_each_step) ZOE_RETURN_IF_ERROR(engine.flush().status());
    run.losses.push_back(loss);
    run.grad_norms.push_back(r.grad_norm);
    run.comm.push_back(comm.bytes_sent());
  }
  // The last step's update: stage 3 overlaps it with what comes next, here nothing.
  ZOE_ASSIGN_OR_RETURN(StepResult last, engine.flush());
  run.host_stepped = last.host_stepped;
  run.ledger = dev.ledger().snapshot();
  run.sched = engine.sched_stats();
  for (int u = 0; u < engine.num_units(); ++u) run.owned += engine.owned_range(u).end - engine.owned_range(u).begin;
  ZOE_ASSIGN_OR_RETURN(run.params, all_params(engine));
  return run;
}

Config scheduler_off(Config c) {
  c.prefetch_bucket_size = 0;
  c.max_reuse_distance = 0;
  return c;
}

Config scheduler_tight(Config c) {
  c.prefetch_bucket_size = 1500;  // the MLP's units are 1333 elements
  c.max_live_parameters = 3000;
  c.max_reuse_distance = 3000;
  return c;
}

Config with_nvme_offload(Config c, const std::string& dir, double ratio) {
  c.offload_optimizer.device = OffloadDevice::kNvme;
  c.offload_optimizer.nvme_path = dir;
  c.offload_optimizer.ratio = ratio;
  if (c.stage == 3) c.offload_param = c.offload_optimizer;
  c.aio_block_size = 4096;
  c.aio_queue_depth = 8;
  c.sub_group_size = 1000;  // many sub-groups: the pipeline's every path runs
  return c;
}

std::string check_nvme_matches_memory(Comm& comm) {
  std::string dir = make_temp_dir("nvme");
  for (int stage = 1; stage <= 3; ++stage) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      Config c = mlp_config(stage, dt);
      auto mem = run_mlp(scheduler_off(c), comm, 4);
      if (!mem.ok()) return mem.status().message();
      struct Home {
        OffloadDevice device;
        double ratio;
      } homes[] = {{OffloadDevice::kNvme, 1.0}, {OffloadDevice::kNvme, 0.5}, {OffloadDevice::kCpu, 0.5},
                   {OffloadDevice::kCpu, 1.0}};
      for (const Home& home : homes) {
        double ratio = home.ratio;
        Tier tier = home.device == OffloadDevice::kNvme ? Tier::kNvme : Tier::kHost;
        std::string what = fmt::format("stage {} {} {} ratio {}", stage, dtype_name(dt), tier_name(tier), ratio);
        Config oc = with_nvme_offload(c, dir, ratio);
        oc.offload_optimizer.device = home.device;
        if (stage == 3) oc.offload_param.device = home.device;
        // The scheduler (prefetch and reuse) moves the same bytes as plain fetches: off; on with
        // the defaults (everything ahead, everything kept) and the update overlapped with the
        // next forward; and with room for about one unit, each update waited for (so the loads
        // ahead start at the step's end, whatever the threads' timing).
        Result<MlpRun> nv = Status::Runtime("not run");
        for (const Config& sc : {scheduler_off(oc), oc, scheduler_tight(oc)}) {
          nv = run_mlp(sc, comm, 4, /*flush_each_step=*/sc.prefetch_bucket_size == 1500);
          if (!nv.ok()) return what + ": " + nv.status().message();
          std::string sched = sc.prefetch_bucket_size == 0 ? "off" : sc.prefetch_bucket_size == oc.prefetch_bucket_size
                                                                         ? "on" : "tight";
          if (nv->params.size() != mem->params.size() ||
              std::memcmp(nv->params.data(), mem->params.data(), mem->params.size() * 4) != 0)
            return what + ", scheduler " + sched + ": weights differ from the in-memory run";
          // Stage 3: it really ran (off: it did nothing).
          const auto& st = nv->sched;
          bool worked = sched == "on" ? st.fetched_kept > 0 : st.loads_ahead > 0 && st.fetched_loading > 0;
          bool idle = st.loads_ahead == 0 && st.fetched_kept == 0;
          if (stage == 3 && (sched == "off" ? !idle : !worked))
            return what + fmt::format(", scheduler {}: {} loads ahead, {} fetches found their load, {} kept", sched,
                                      st.loads_ahead, st.fetched_loading, st.fetched_kept);
          // Several ranks: loads from host memory are issued whole, so their gathers start one
          // fetch ahead on the communication thread.
          if (stage == 3 && sched == "tight" && comm.size() > 1 &&
              home.device == OffloadDevice::kCpu && st.gathered_ahead == 0)
            return what + ", scheduler tight: no all-gather started ahead of its fetch";
        }
        uint64_t total_mem = 0, total_nv = 0;
        for (int t = 0; t < kNumTiers; ++t) {
          total_mem += mem->ledger.persistent(static_cast<Tier>(t));
          total_nv += nv->ledger.persistent(static_cast<Tier>(t));
        }
        uint64_t moved = nv->ledger.persistent(tier);
        uint64_t v = nv->ledger.bytes[static_cast<int>(tier)][static_cast<int>(Kind::kExpAvgSq)];
        uint64_t want_v = 4 * static_cast<uint64_t>(std::llround(ratio * static_cast<double>(nv->shard)));
        if (total_nv != total_mem) return what + ": persistent bytes changed, not moved";
        // ZeRO-Offload: the CPU Adam steps the state that is not device memory: all of it at ratio 1,
        // no more than the offloaded part (padding is never stepped) otherwise, none in memory. (A
        // rank's count depends on where its padding falls; these bounds hold on every rank.)
        int64_t off = std::llround(ratio * static_cast<double>(nv->shard));
        bool right = ratio == 1.0 ? nv->host_stepped == nv->owned
                                  : nv->host_stepped <= off && nv->host_stepped <= nv->owned;
        if (mem->host_stepped != 0 || !right)
          return what + fmt::format(": the CPU Adam stepped {} of {} elements (in memory: {}), {} offloaded",
                                    nv->host_stepped, nv->owned, mem->host_stepped, off);
        if (v != want_v) return what + fmt::format(": exp_avg_sq offloaded {} bytes, expected {}", v, want_v);
        // The reduced gradient shard follows the optimizer into host memory (stages 2-3).
        uint64_t host_grads = nv->ledger.bytes[static_cast<int>(Tier::kHost)][static_cast<int>(Kind::kGrad)];
        if ((host_grads == 0) != (stage < 2))
          return what + fmt::format(": {} bytes of gradients in host memory at stage {}", host_grads, stage);
        if (tier == Tier::kHost) host_grads = 0;  // counted in `moved`
        if (mem->ledger.persistent(Tier::kDevice) - nv->ledger.persistent(Tier::kDevice) != moved + host_grads)
          return what + ": the device tier did not shrink by the offloaded bytes";
      }
    }
  }
  return "";
}

Result<std::vector<float>> run_orders(const Config& c, Comm& control, const std::vector<std::vector<int>>& orders,
                                      ZeroEngine::SchedStats* stats, bool flush_each_step) {
  ZOE_ASSIGN_OR_RETURN(TestDevice td, make_test_device(c.device_memory_budget, c.host_memory_budget, control));
  Device& dev = *td.device;
  Comm& comm = *td.comm;
  MlpModel model(c.n_layer, c.n_embd, 99);
  ZeroEngine engine(engine_options(c), dev, comm, model.units());
  ZOE_RETURN_IF_ERROR(engine.allocate());
  ZOE_RETURN_IF_ERROR(init_params(engine, model, c.seed));
  std::vector<float> w, g;
  for (const auto& order : orders) {
    for (int u : order) {
      w.resize(engine.unit(u).numel);
      ZOE_RETURN_IF_ERROR(fetch_to_host(engine, u, w.data()));
      g.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i) g[i] = 0.5f * w[i] + 0.01f * static_cast<float>(u + 1);
      ZOE_RETURN_IF_ERROR(grads_from_host(engine, u, g.data()));
    }
    ZOE_RETURN_IF_ERROR(engine.step(c.lr).status());
    if (flush_each_step) ZOE_RETURN_IF_ERROR(engine.flush().status());
  }
  if (stats) *stats = engine.sched_stats();
  return all_params(engine);
}

std::string check_reordered_steps_match(Comm& comm) {
  // The MLP's five units: forward and backward; then a step in another order, one that stops
  // early, and the first order again. Each gradient is a function of what its fetch returned.
  std::vector<int> a = {0, 1, 2, 3, 4, 4, 3, 2, 1, 0}, b = {0, 1, 3, 2, 4, 4, 2, 3, 1, 0}, early = {0, 1, 2};
  std::vector<std::vector<int>> orders = {a, a, b, a, early, a, a};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Config c = mlp_config(3, dt);
    auto ref = run_orders(scheduler_off(c), comm, orders, nullptr, false);
    if (!ref.ok()) return ref.status().message();
    for (const Config& sc : {c, scheduler_tight(c)}) {
      ZeroEngine::SchedStats st;
      bool tight = sc.prefetch_bucket_size != c.prefetch_bucket_size;
      auto run = run_orders(sc, comm, orders, &st, /*flush_each_step=*/tight);
      if (!run.ok()) return run.status().message();
      std::string what = fmt::format("{} bucket {}", dtype_name(dt), sc.prefetch_bucket_size);
      if (*run != *ref) return what + ": weights differ from the run without the scheduler";
      // b and early leave a's order, a leaves b's and early's: four deviations; and it worked.
      if (st.deviations != 4 || (tight && st.loads_ahead == 0))
        return what + fmt::format(": {} deviations (expected 4), {} loads ahead", st.deviations, st.loads_ahead);
    }
  }
  return "";
}

std::string check_quarter_budget(Comm& comm) {
  // A unit in flight is whole (gathered weights, fp32 gradient, reduction buffer: 8 bytes per
  // element of the unit) while the footprint is 16 bytes per element of the shard: 32 units
  // leave room beside it for a few kept and prefetched ones at N = 4.
  // On cuda, wider units and a seventh instead of an eighth: the caching allocator's 512-byte
  // blocks would add a third to the MLP's 1202-byte ones, and sum_squares keeps its partials in
  // device memory; an eighth then leaves no room beyond what is in flight.
  const bool cuda = test_device_name() == "cuda";
  Config c = mlp_config(3, DType::kBF16, 32, cuda ? 64 : 24);
  auto mem = run_mlp(c, comm, 4);
  if (!mem.ok()) return mem.status().message();
  uint64_t footprint = 0;  // stage 3's persistent bytes on this rank, every tier
  for (int t = 0; t < kNumTiers; ++t) footprint += mem->ledger.persistent(static_cast<Tier>(t));
  // State in host memory, then on NVMe, then on NVMe within an eighth: there a chunk the device
  // has no room for yet is read ahead into pinned memory (staged) and only uploaded at its fetch.
  std::string dir = make_temp_dir("quarter");
  for (int tight = 0; tight < 3; ++tight) {
    OffloadDevice home = tight == 0 ? OffloadDevice::kCpu : OffloadDevice::kNvme;
    Config q = home == OffloadDevice::kNvme ? with_nvme_offload(c, dir, 1.0) : c;
    q.device_memory_budget = footprint / (tight == 2 ? (cuda ? 7 : 8) : 4);
    q.offload_param.device = q.offload_optimizer.device = home;
    std::string what = home == OffloadDevice::kNvme ? (tight == 2 ? "nvme, an eighth (cuda: a seventh)" : "nvme") : "host";
    auto run = run_mlp(q, comm, 4, /*flush_each_step=*/true);  // the loads ahead start at the step's end
    if (!run.ok()) return what + " budget " + std::to_string(q.device_memory_budget) + ": " + run.status().message();
    uint64_t peak = run->ledger.peak[static_cast<int>(Tier::kDevice)];
    if (peak > q.device_memory_budget)
      return fmt::format("{}: device peak {} exceeds the budget {}", what, peak, q.device_memory_budget);
    if (run->params != mem->params) return what + ": weights differ from the run with everything on the device";
    // (On cuda at several ranks NCCL's staging takes device memory that keeping units needs.)
    if (run->sched.loads_ahead == 0 || (run->sched.fetched_kept == 0 && !(cuda && comm.size() > 1)))
      return what + fmt::format(": the scheduler did nothing within the budget (test too tight): {} loads ahead, {} kept",
                                run->sched.loads_ahead, run->sched.fetched_kept);
    if (run->sched.reductions_async == 0 && reductions_on_thread(comm, q.grad_accum))
      return what + ": no gradient reduction ran on the communication thread within the budget";
    if (tight == 2 && run->sched.staged_ahead == 0)
      return what + ": no chunk was read ahead into pinned memory while the device had no room";
  }
  std::filesystem::remove_all(dir);
  return "";
}

std::string check_staging_booked_at_start(Comm& comm) {
  auto comm_bytes = [](const LedgerSnapshot& l) {
    uint64_t b = 0;
    for (int t = 0; t < kNumTiers; ++t) b += l.bytes[t][static_cast<int>(Kind::kComm)];
    return b;
  };
  for (int stage = 0; stage <= 3; ++stage)
    for (bool overlap : {false, true}) {
      Config c = mlp_config(stage, DType::kBF16);
      c.overlap_comm = overlap;
      auto run = run_mlp(c, comm, 2);
      std::string what = fmt::format("stage {}, overlap_comm {}", stage, overlap);
      if (!run.ok()) return what + ": " + run.status().message();
      // One largest chunk from every rank in the gradient dtype (MPI rounds to 64 bytes).
      const uint64_t one = static_cast<uint64_t>(run->largest_chunk) * comm.size() * 2;
      const uint64_t start = comm_bytes(run->at_start), end = comm_bytes(run->ledger);
      if (start < one || start >= one + 64)
        return what + fmt::format(": {} bytes of staging booked at the start, expected {} (one reduction's)", start, one);
      if (end != start) return what + fmt::format(": staging {} bytes at the start, {} after training", start, end);
    }
  return "";
}

std::string check_overlapped_reductions(Comm& comm) {
  for (int stage : {2, 3})
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int accum : {1, 3}) {
        Config c = mlp_config(stage, dt);
        c.grad_accum = accum;
        std::string what = fmt::format("stage {} {} accumulation {}", stage, dtype_name(dt), accum);
        c.overlap_comm = false;
        auto off = run_mlp(c, comm, 4);
        c.overlap_comm = true;
        auto on = run_mlp(c, comm, 4);
        if (!off.ok()) return what + ", at the hand-over: " + off.status().message();
        if (!on.ok()) return what + ", overlapped: " + on.status().message();
        if (off->sched.reductions_async != 0) return what + ": overlap_comm false still used the thread";
        if (on->sched.reductions_async == 0 && reductions_on_thread(comm, accum))
          return what + ": no reduction ran on the communication thread";
        // The norms see every micro-step's gradient, where clipping and Adam's scale invariance
        // could hide one lost.
        if (on->params != off->params || on->grad_norms != off->grad_norms) return what + ": weights differ";
        for (size_t k = 0; k < on->comm.size(); ++k)
          if (on->comm[k].reduce_scatter != off->comm[k].reduce_scatter || on->comm[k].total() != off->comm[k].total())
            return fmt::format("{}: step {} sent {} bytes overlapped, {} at the hand-over", what, k,
                               on->comm[k].total(), off->comm[k].total());
        // With the optimizer offloaded the reductions land in the host gradient shard, each
        // micro-step's added there: the same weights.
        c.offload_optimizer.device = OffloadDevice::kCpu;
        auto host = run_mlp(c, comm, 4);
        if (!host.ok()) return what + ", gradients in host memory: " + host.status().message();
        if (host->ledger.bytes[static_cast<int>(Tier::kHost)][static_cast<int>(Kind::kGrad)] == 0)
          return what + ": the gradient shard is not in host memory with the optimizer offloaded";
        if (host->params != off->params || host->grad_norms != off->grad_norms)
          return what + ": weights differ with the gradients in host memory";
      }
  return "";
}

std::string check_update_in_backward(Comm& comm) {
  std::string dir = make_temp_dir("update-in-backward");
  // On cuda: stage 0 (nothing released early) and 3 (everything released); the CPU device runs all
  // four, and in CI cuda is the emulation, whose kernels run on one core.
  const bool cuda = test_device_name() == "cuda";
  for (int stage = 0; stage <= 3; ++stage)
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int accum : {1, 2}) {
        if (accum == 1 && comm.size() > 1) continue;  // one rank runs it; more ranks need not again
        if (cuda && (stage == 1 || stage == 2)) continue;
        Config c = mlp_config(stage, dt);
        c.grad_accum = accum;
        c.grad_clip = 0;  // what update_in_backward requires
        std::vector<std::pair<std::string, Config>> homes = {{"in memory", c}};
        if (stage >= 2) {  // gradients final in the backward: units are released there
          Config host = c;
          host.offload_optimizer.device = OffloadDevice::kCpu;
          if (stage == 3) host.offload_param.device = OffloadDevice::kCpu;
          homes.push_back({"in host memory", host});
          homes.push_back({"half on NVMe", with_nvme_offload(c, dir, 0.5)});
          homes.push_back({"on NVMe", with_nvme_offload(c, dir, 1.0)});
        }
        for (auto& [home, h] : homes) {
          std::string what = fmt::format("stage {} {} accumulation {}, state {}", stage, dtype_name(dt), accum, home);
          auto after = run_mlp(h, comm, 4);
          h.update_in_backward = true;
          auto during = run_mlp(h, comm, 4);
          if (!after.ok()) return what + ", update after the backward: " + after.status().message();
          if (!during.ok()) return what + ", update during the backward: " + during.status().message();
          if (during->params != after->params || during->grad_norms != after->grad_norms)
            return what + ": weights differ between the update during and after the backward";
          const int64_t early = during->sched.units_updated_in_backward;
          if (stage >= 2 && early == 0) return what + ": no unit was released to the update during the backward";
          if (stage < 2 && early != 0)
            return what + fmt::format(": {} units released before step(), with gradients reduced only there", early);
          if (after->sched.units_updated_in_backward != 0) return what + ": released early without the key";
        }
      }
  return "";
}

// Elementwise |a - b| <= rel * max(|b|, floor): "" or the worst element.
static std::string within(const std::vector<float>& a, const std::vector<float>& b, double rel, double floor) {
  if (a.size() != b.size()) return fmt::format("{} weights against {}", a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(double(a[i]) - b[i]) > rel * std::max(std::fabs(double(b[i])), floor))
      return fmt::format("weight {}: {} against {} (bound {} relative)", i, a[i], b[i], rel);
  return "";
}

std::string check_speculative_update(Comm& comm) {
  std::string dir = make_temp_dir("speculative-update");
  struct Case {
    DType dt;
    double clip;  // -1: 0.6 of the smallest unclipped norm (every step clipped, by at most 0.6)
    double rel;   // the weights' bound where updates were taken back: a few of dt's roundings
  };
  // fp32 and bf16 with a clip that bites every step, fp16 whose first steps overflow at 2^20;
  // then a clip that never bites. (Taken back, m and v lose ~1e-7 / coefficient^2 of their size:
  // the step's own term cancels; a clip by 0.6 or less is what users' clipping does.)
  std::vector<Case> cases = {
      {DType::kF32, -1, 1e-5}, {DType::kBF16, -1, 2e-2}, {DType::kF16, 0, 4e-3}, {DType::kBF16, 1e30, 0}};
  // One rank on the CPU device runs every case; more ranks and the emulated GPU (whose kernels run
  // on the CPU) the ones where the reductions meet the take-back: stage 3, fp32 clipped, fp16.
  const bool brief = comm.size() > 1 || test_device_name() == "cuda";
  if (brief) cases = {cases[0], cases[2]};
  for (int stage : {0, 3})
    for (const Case& k : cases) {
      if (brief && stage == 0) continue;
      Config c = mlp_config(stage, k.dt);
      c.grad_clip = k.clip;
      c.initial_scale_power = 20;  // fp16: the first two steps overflow
      if (k.clip < 0) {
        c.grad_clip = 0;
        auto free = run_mlp(c, comm, 4);
        if (!free.ok()) return "unclipped: " + free.status().message();
        c.grad_clip = 0.6 * *std::min_element(free->grad_norms.begin(), free->grad_norms.end());
      }
      std::vector<std::pair<std::string, Config>> homes = {{"in memory", c}};
      Config host = c;
      host.offload_optimizer.device = OffloadDevice::kCpu;
      if (!brief) homes.push_back({"in host memory", host});
      if (stage == 3) homes.push_back({"on NVMe", with_nvme_offload(c, dir, 1.0)});
      for (auto& [home, h] : homes) {
        std::string what = fmt::format("stage {} {} clip {}, state {}", stage, dtype_name(k.dt), c.grad_clip, home);
        auto after = run_mlp(h, comm, 4);
        h.update_in_backward = true;
        auto during = run_mlp(h, comm, 4);
        if (!after.ok()) return what + ", update after the backward: " + after.status().message();
        if (!during.ok()) return what + ", update during the backward: " + during.status().message();
        const int64_t taken_back = during->sched.updates_taken_back;
        if (during->taken_back != taken_back)
          return what + fmt::format(": {} steps say their update was taken back, {} were", during->taken_back, taken_back);
        if (during->skipped != after->skipped) return what + ": the steps skipped differ";
        if (k.rel == 0) {  // nothing to take back: the speculation held
          if (taken_back != 0) return what + fmt::format(": {} updates taken back with a clip that never bites", taken_back);
          if (during->params != after->params || during->grad_norms != after->grad_norms)
            return what + ": weights differ between the update during and after the backward";
          continue;
        }
        int overruled = after->skipped;
        for (double norm : after->grad_norms) overruled += h.grad_clip > 0 && norm > h.grad_clip;
        if (overruled == 0) return what + ": no step clipped or overflowed (test too weak)";
        // The first step speculates and is taken back; after it the updates wait for their norms
        // while every step is clipped (or, fp16, until a step goes through unscathed).
        const int64_t want = stage == 3 ? 1 : 0;  // at stage 0 nothing was stepped: the pass just ends
        if (taken_back != want)
          return what + fmt::format(": {} updates taken back, {} expected ({} steps clipped or skipped)", taken_back,
                                    want, overruled);
        if (std::string d = within(during->params, after->params, k.rel, 1e-2); !d.empty()) return what + ": " + d;
      }
    }
  std::filesystem::remove_all(dir);
  return "";
}

}  // namespace zoe::test

#include "engine_harness.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "sched/zero_engine.h"
#include "test_util.h"

namespace zoe::test {

Result<MlpRun> run_mlp(const Config& c, Comm& comm, int steps) {
  MlpModel model(c.n_layer, c.n_embd, 99);
  auto source = make_synthetic_source(c.micro_batch, comm.rank(), comm.size());
  return run_model(c, comm, steps, model, *source);
}

Status init_params(Engine& e, const Model& model, uint64_t seed) {
  std::vector<float> buf;
  for (int u = 0; u < e.num_units(); ++u) {
    buf.resize(e.unit(u).numel);
    model.init_unit(u, seed, buf.data());
    ZOE_RETURN_IF_ERROR(e.set_params(u, buf.data()));
  }
  return Status::Ok();
}

Result<MlpRun> run_model(const Config& c, Comm& comm, int steps, Model& model, BatchSource& source) {
  CpuDevice dev(c.device_memory_budget, c.host_memory_budget, /*strict=*/true);
  // Communication staging is booked in this run's ledger, and unbooked before the ledger goes.
  comm.set_ledger(&dev.ledger());
  struct Unbook {
    Comm& c;
    ~Unbook() { c.set_ledger(nullptr); }
  } unbook{comm};
  auto units = model.units();
  ZeroEngine engine(c, dev, comm, units);
  ZOE_RETURN_IF_ERROR(engine.allocate());
  ZOE_RETURN_IF_ERROR(init_params(engine, model, c.seed));
  MlpRun run;
  run.padded = engine.layout().padded_params();
  run.shard = engine.layout().shard_size();
  for (int s = 0; s < steps; ++s) {
    comm.reset_counters();
    double loss = 0;
    for (int m = 0; m < c.grad_accum; ++m) {
      ZOE_ASSIGN_OR_RETURN(Batch b, source.next());
      ZOE_ASSIGN_OR_RETURN(double l, model.train_micro_step(engine, b, static_cast<float>(engine.loss_scale())));
      loss += l;
    }
    ZOE_ASSIGN_OR_RETURN(StepResult r, engine.step(c.lr));
    run.host_stepped = r.host_stepped;
    run.losses.push_back(loss);
    run.comm.push_back(comm.bytes_sent());
  }
  run.ledger = dev.ledger().snapshot();
  for (int u = 0; u < engine.num_units(); ++u) run.owned += engine.owned_range(u).end - engine.owned_range(u).begin;
  for (int u = 0; u < engine.num_units(); ++u) {
    size_t at = run.params.size();
    run.params.resize(at + engine.unit(u).numel);
    ZOE_RETURN_IF_ERROR(fetch_to_host(engine, u, run.params.data() + at));
  }
  return run;
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
      auto mem = run_mlp(c, comm, 4);
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
        auto nv = run_mlp(oc, comm, 4);
        if (!nv.ok()) return what + ": " + nv.status().message();
        if (nv->params.size() != mem->params.size() ||
            std::memcmp(nv->params.data(), mem->params.data(), mem->params.size() * 4) != 0)
          return what + ": weights differ from the in-memory run";
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
        if (mem->ledger.persistent(Tier::kDevice) - nv->ledger.persistent(Tier::kDevice) != moved)
          return what + ": the device tier did not shrink by the offloaded bytes";
      }
    }
  }
  return "";
}

}  // namespace zoe::test

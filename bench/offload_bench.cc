#include "offload_bench.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include <cblas.h>
#include <tbb/global_control.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/profiler.h"
#include "train/batch_source.h"
#include "model/gpt2_model.h"
#include "sched/zero_engine.h"
#include "train/backend.h"
#include "train/trace_writer.h"

namespace zoe {
namespace {

const std::string kCorpus = std::string(ZOE_SOURCE_DIR) + "/data/corpus.txt";

Config bench_config(const OffloadBenchOptions& o, bool offload, uint64_t budget) {
  Config c;
  c.stage = 3;
  c.dtype = DType::kBF16;
  c.micro_batch = o.B;
  c.lr = 1e-4;
  c.grad_clip = 1.0;
  c.device = "cpu";
  c.device_memory_budget = budget;
  c.host_memory_budget = uint64_t{4} << 30;
  if (offload)
    for (OffloadConfig* oc : {&c.offload_param, &c.offload_optimizer}) {
      oc->device = OffloadDevice::kNvme;
      oc->nvme_path = o.nvme_dir;
    }
  return c;
}

struct Run {
  double step_s = 0;          // median of the timed steps
  uint64_t persistent = 0;    // bytes of training state, every tier
  uint64_t peak_device = 0;
  std::vector<int> order;     // the units' fetch order of one step
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Steps of `one_step` on a fresh engine: the median of the timed ones. With a trace path, the
// last step's timeline is kept.
Result<Run> run(const OffloadBenchOptions& o, const Config& c, bool trace,
                const std::function<Status(ZeroEngine&, Gpt2Model&, BatchSource&)>& one_step) {
  auto comm = make_self_comm();
  ZOE_ASSIGN_OR_RETURN(Backend backend, make_backend(c, *comm));
  // Activation checkpointing: a quarter of the state is what the device has for everything.
  Gpt2Model model(o.shape, /*activation_checkpointing=*/true);
  auto engine = std::make_unique<ZeroEngine>(c, *backend.device, *comm, model.units());
  ZOE_RETURN_IF_ERROR(engine->allocate());
  ZOE_RETURN_IF_ERROR(init_params(*engine, model, c.seed));
  ZOE_ASSIGN_OR_RETURN(auto source, make_token_source(kCorpus, "bytes", o.shape.vocab_size, o.B, o.T, 0, 1));
  std::vector<double> secs;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    bool last = i + 1 == o.warmup + o.iters;
    if (trace && last) {
      Profiler::get().clear_events();
      Profiler::get().enable_trace(true);
    }
    auto t0 = std::chrono::steady_clock::now();
    ZOE_RETURN_IF_ERROR(one_step(*engine, model, *source));
    if (i >= o.warmup) secs.push_back(seconds_since(t0));
    if (trace && last) {
      Profiler::get().enable_trace(false);
      ZOE_RETURN_IF_ERROR(write_trace(*comm, o.trace_path));
    }
  }
  Run r;
  std::sort(secs.begin(), secs.end());
  r.step_s = secs[secs.size() / 2];
  LedgerSnapshot l = backend.device->ledger().snapshot();
  for (int t = 0; t < kNumTiers; ++t) r.persistent += l.persistent(static_cast<Tier>(t));
  r.peak_device = l.peak[static_cast<int>(Tier::kDevice)];
  r.order = engine->unit_order();
  return r;
}

Status train_step(ZeroEngine& e, Gpt2Model& m, BatchSource& src) {
  ZOE_ASSIGN_OR_RETURN(Batch b, src.next());
  ZOE_RETURN_IF_ERROR(m.train_micro_step(e, b, 1.0f).status());
  return e.step(1e-4).status();
}

}  // namespace

Status bench_offload(const OffloadBenchOptions& o, nlohmann::json* out, std::FILE* human) {
  // Fewer compute threads than cores leave the I/O thread and the optimizer's a core of their
  // own: on a 2-core machine that is what decides whether I/O can hide behind compute at all.
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  openblas_set_num_threads(threads);
  std::filesystem::create_directories(o.nvme_dir);
  // Compute only: everything resident, a budget that never binds.
  ZOE_ASSIGN_OR_RETURN(Run compute, run(o, bench_config(o, false, uint64_t{8} << 30), false, train_step));
  const uint64_t budget = compute.persistent / 4;
  Config oc = bench_config(o, true, budget);
  ZOE_ASSIGN_OR_RETURN(Run offloaded, run(o, oc, !o.trace_path.empty(), train_step));
  // I/O only: the offloaded step's unit order without the model, zero gradients, the optimizer.
  std::vector<int> order = offloaded.order;
  auto io_step = [&](ZeroEngine& e, Gpt2Model&, BatchSource&) -> Status {
    for (int u : order) {
      ZOE_RETURN_IF_ERROR(e.fetch(u).status());
      ZOE_RETURN_IF_ERROR(e.release(u));
    }
    int64_t most = 0;
    for (int u = 0; u < e.num_units(); ++u) most = std::max(most, e.unit(u).numel);
    ZOE_ASSIGN_OR_RETURN(Buffer zeros, e.device().alloc(most * 4, Tier::kDevice, Kind::kActivation));
    Status st = e.device().zero(zeros.data, zeros.bytes);
    for (int u = e.num_units() - 1; st.ok() && u >= 0; --u) st = e.grads_ready(u, zeros.as<float>());
    e.device().free(zeros);
    ZOE_RETURN_IF_ERROR(st);
    return e.step(1e-4).status();
  };
  ZOE_ASSIGN_OR_RETURN(Run io, run(o, oc, false, io_step));
  // The same offloaded step with the scheduler off (no prefetch, no reuse), for reference.
  Config off = oc;
  off.prefetch_bucket_size = 0;
  off.max_reuse_distance = 0;
  ZOE_ASSIGN_OR_RETURN(Run serial, run(o, off, false, train_step));
  double bound = std::max(compute.step_s, io.step_s);
  std::string shape = fmt::format(
      "gpt2 L{} C{} B{} T{} bf16 stage 3, state {:.0f} MB = {:.1f}x the device budget, {} compute thread(s)",
      o.shape.n_layer, o.shape.n_embd, o.B, o.T, compute.persistent / 1e6, double(compute.persistent) / budget,
      threads);
  if (human)
    std::fprintf(human, "# %s; params and optimizer on NVMe (%s)\n%10s %10s %16s %12s %8s %8s\n", shape.c_str(),
                 o.nvme_dir.c_str(), "scheduler", "step_s", "compute_only_s", "io_only_s", "ratio", "overlap");
  nlohmann::json results = nlohmann::json::array();
  for (const auto& [label, r] : {std::pair<const char*, const Run&>{"on", offloaded}, {"off", serial}}) {
    double ratio = r.step_s / bound;
    // Overlap: the share of the shorter of compute and I/O that ran under the other.
    double overlap = (compute.step_s + io.step_s - r.step_s) / std::min(compute.step_s, io.step_s);
    if (human)
      std::fprintf(human, "%10s %10.3f %16.3f %12.3f %8.2f %7.0f%%\n", label, r.step_s, compute.step_s, io.step_s,
                   ratio, 100 * overlap);
    results.push_back({{"case", fmt::format("{}, scheduler {}", shape, label)}, {"step_s", r.step_s},
                       {"compute_only_s", compute.step_s}, {"io_only_s", io.step_s}, {"ratio", ratio},
                       {"overlap", overlap}, {"device_budget_bytes", budget}, {"peak_device_bytes", r.peak_device},
                       {"state_bytes", compute.persistent}, {"threads", threads}});
  }
  if (human)
    std::fprintf(human, "device peak %.1f MB of a %.1f MB budget%s\n", offloaded.peak_device / 1e6, budget / 1e6,
                 o.trace_path.empty() ? "" : ("; trace of one step (scheduler on): " + o.trace_path).c_str());
  if (out) *out = {{"bench", "offload"}, {"trace", o.trace_path}, {"results", results}};
  return Status::Ok();
}

}  // namespace zoe

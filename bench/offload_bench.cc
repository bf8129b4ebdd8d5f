#include "offload_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

#include <tbb/global_control.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/profiler.h"
#include "train/batch_source.h"
#include "model/gpt2_model.h"
#include "sched/zero_engine.h"
#include "train/backend.h"
#include "train/trace_writer.h"
#include "bench_process.h"
#include "bench_engine.h"
#include "bench_stats.h"

namespace zoe {
namespace {


// nvme_dir empty: everything resident; else stage 3 with parameters and optimizer state there.
Config bench_config(const OffloadBenchOptions& o, const std::string& nvme_dir, uint64_t budget) {
  Config c;
  c.stage = 3;
  c.dtype = DType::kBF16;
  c.micro_batch = o.B;
  c.lr = 1e-4;
  c.grad_clip = 1.0;
  c.device = o.device;
  c.checksums = o.checksums;
  c.aio_block_size = o.aio_block_size;
  c.aio_queue_depth = o.aio_queue_depth;
  c.device_memory_budget = budget;
  c.host_memory_budget = uint64_t{4} << 30;
  if (!nvme_dir.empty()) {
    std::filesystem::create_directories(nvme_dir);
    for (OffloadConfig* oc : {&c.offload_param, &c.offload_optimizer}) {
      oc->device = OffloadDevice::kNvme;
      oc->nvme_path = nvme_dir;
    }
  }
  return c;
}

// One configuration, kept alive so that its steps interleave with the other cases' (load here
// drifts within seconds: cases timed one after the other measured the drift).
struct OffloadCase {
  std::unique_ptr<Comm> comm;  // before the engine: it holds references to comm and device
  Backend backend;
  std::unique_ptr<Gpt2Model> model;
  std::unique_ptr<ZeroEngine> engine;
  std::unique_ptr<BatchSource> source;
  std::function<Status(OffloadCase&)> one_step;
  std::vector<double> secs;
  std::vector<double> user_s, sys_s;  // the process's CPU time during each timed step
  std::vector<double> steal_s;        // the machine's vCPUs' stolen time then (all of them)
  std::vector<double> read_mb, written_mb;  // what the NVMe devices moved during each timed step
  std::vector<double> io_hashed_mb;         // and what the I/O threads hashed (the rest is Adam's)
  std::vector<double> forwarded_mb;         // reads served from pending writes (not in read_mb)

  double median_s() const { return median(secs); }
  uint64_t persistent() const {
    LedgerSnapshot l = backend.device->ledger().snapshot();
    uint64_t n = 0;
    for (int t = 0; t < kNumTiers; ++t) n += l.persistent(static_cast<Tier>(t));
    return n;
  }
  uint64_t peak_device() const { return backend.device->ledger().snapshot().peak[static_cast<int>(Tier::kDevice)]; }
};

Result<std::unique_ptr<OffloadCase>> make_case(const OffloadBenchOptions& o, const Config& c,
                                        std::function<Status(OffloadCase&)> one_step) {
  auto k = std::make_unique<OffloadCase>();
  k->comm = make_self_comm();
  // Activation checkpointing: a quarter of the state is what the device has for everything.
  k->model = std::make_unique<Gpt2Model>(o.shape, /*activation_checkpointing=*/true);
  ZOE_ASSIGN_OR_RETURN(BenchEngine be, make_bench_engine(c, *k->comm, *k->model));
  k->backend = std::move(be.backend);
  k->engine = std::move(be.engine);
  ZOE_ASSIGN_OR_RETURN(k->source, make_token_source(kBenchCorpus, "bytes", o.shape.vocab_size, o.B, o.T, 0, 1));
  k->one_step = std::move(one_step);
  for (int i = 0; i < o.warmup; ++i) ZOE_RETURN_IF_ERROR(k->one_step(*k));
  ZOE_RETURN_IF_ERROR(k->engine->flush().status());
  return k;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The whole process's CPU seconds so far, user and system: a step that runs I/O and the optimizer
// beside the compute costs CPU the compute-only step does not, and on few cores that is its time.
std::pair<double, double> process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return {s(u.ru_utime), s(u.ru_stime)};
}

// CPU seconds the hypervisor ran something else on this machine's vCPUs (all of them), from
// /proc/stat; 0 where it is not reported. On a shared VM this is the noise of every timing here.
double machine_steal_s() {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return 0;
  unsigned long long v[8] = {};
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                            &v[5], &v[6], &v[7]);
  std::fclose(f);
  const long hz = ::sysconf(_SC_CLK_TCK);
  return n == 8 && hz > 0 ? double(v[7]) / hz : 0;
}

Status train_step(OffloadCase& k) {
  ZOE_ASSIGN_OR_RETURN(Batch b, k.source->next());
  ZOE_RETURN_IF_ERROR(k.model->train_micro_step(*k.engine, b, 1.0f).status());
  return k.engine->step(1e-4).status();
}

// I/O only: a step's unit order without the model: every fetch, zero gradients, the optimizer.
Status io_step(OffloadCase& k, const std::vector<int>& order) {
  ZeroEngine& e = *k.engine;
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
}

}  // namespace

Status bench_offload(const OffloadBenchOptions& o, nlohmann::json* out, std::FILE* human) {
  // Fewer compute threads than cores leave the I/O thread and the optimizer's a core of their
  // own: on a 2-core machine that is what decides whether I/O can hide behind compute at all.
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  Profiler::name_thread("main");
  // Compute only: everything resident, a budget that never binds. Its state sets the budget of
  // the others: a quarter of it, plus what the device's compute ops hold of any budget (a GPU's
  // library workspaces and scratch, as one step grows them; none on the CPU).
  ZOE_ASSIGN_OR_RETURN(auto compute, make_case(o, bench_config(o, "", uint64_t{8} << 30), train_step));
  if (o.warmup == 0) {  // (else make_case's warm-up steps grew them)
    ZOE_RETURN_IF_ERROR(compute->one_step(*compute));
    ZOE_RETURN_IF_ERROR(compute->engine->flush().status());
  }
  const uint64_t budget = compute->persistent() / 4 + compute->backend.device->ops().workspace_bytes();
  ZOE_ASSIGN_OR_RETURN(auto on, make_case(o, bench_config(o, o.nvme_dir + "/on", budget), train_step));
  Config off_config = bench_config(o, o.nvme_dir + "/off", budget);
  off_config.prefetch_bucket_size = 0;  // the same offloaded step without prefetch or reuse
  off_config.max_reuse_distance = 0;
  ZOE_ASSIGN_OR_RETURN(auto off, make_case(o, off_config, train_step));
  std::vector<int> order = on->engine->unit_order();
  ZOE_ASSIGN_OR_RETURN(auto io, make_case(o, bench_config(o, o.nvme_dir + "/io", budget),
                                          [order](OffloadCase& k) { return io_step(k, order); }));
  // Rounds: each case in turn, the order rotating. A turn is two steps, the second timed, then
  // the update is flushed: stage 3 overlaps a step's update with the next step, so the timed step
  // carries the one before it as in a steady run, and no case's update runs into another's
  // turn. The trace is of "on"'s last timed step.
  std::vector<OffloadCase*> cases = {compute.get(), on.get(), off.get(), io.get()};
  for (int r = 0; r < o.iters; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      OffloadCase& k = *cases[(i + r) % cases.size()];
      ZOE_RETURN_IF_ERROR(k.one_step(k));
      bool trace = &k == on.get() && r + 1 == o.iters && !o.trace_path.empty();
      if (trace) {
        Profiler::get().clear_events();
        Profiler::get().enable_trace(true);
      }
      const ZeroEngine::SchedStats io0 = k.engine->sched_stats();
      auto [user0, sys0] = process_cpu_s();
      const double steal0 = machine_steal_s();
      auto t0 = std::chrono::steady_clock::now();
      ZOE_RETURN_IF_ERROR(k.one_step(k));
      k.secs.push_back(seconds_since(t0));
      auto [user1, sys1] = process_cpu_s();
      k.steal_s.push_back(machine_steal_s() - steal0);
      const ZeroEngine::SchedStats io1 = k.engine->sched_stats();
      k.read_mb.push_back((io1.nvme_read_bytes - io0.nvme_read_bytes) / 1e6);
      k.written_mb.push_back((io1.nvme_written_bytes - io0.nvme_written_bytes) / 1e6);
      k.io_hashed_mb.push_back((io1.nvme_hashed_bytes - io0.nvme_hashed_bytes) / 1e6);
      k.forwarded_mb.push_back((io1.nvme_forwarded_bytes - io0.nvme_forwarded_bytes) / 1e6);
      k.user_s.push_back(user1 - user0);
      k.sys_s.push_back(sys1 - sys0);
      if (trace) {
        Profiler::get().enable_trace(false);
        ZOE_RETURN_IF_ERROR(write_trace(*k.comm, o.trace_path));
      }
      ZOE_RETURN_IF_ERROR(k.engine->flush().status());
    }
  const double compute_s = compute->median_s(), io_s = io->median_s(), bound = std::max(compute_s, io_s);
  const uint64_t state = compute->persistent();
  std::string shape = fmt::format(
      "gpt2 L{} C{} B{} T{} bf16 stage 3 on {}, state {:.0f} MB = {:.1f}x the device budget, {} compute thread(s){}",
      o.shape.n_layer, o.shape.n_embd, o.B, o.T, o.device, state / 1e6, double(state) / budget, threads,
      o.checksums ? "" : ", no checksums");
  const std::string aio = fmt::format("aio.block_size {}, aio.queue_depth {}", o.aio_block_size, o.aio_queue_depth);
  if (human)
    std::fprintf(human, "# %s; params and optimizer on NVMe (%s; %s)\n%10s %10s %16s %12s %8s %8s %14s\n", shape.c_str(),
                 o.nvme_dir.c_str(), aio.c_str(), "scheduler", "step_s", "compute_only_s", "io_only_s", "ratio", "overlap",
                 "cpu_s usr+sys");
  nlohmann::json results = nlohmann::json::array();
  for (const auto& [label, k] : {std::pair<const char*, OffloadCase*>{"on", on.get()}, {"off", off.get()}}) {
    double step_s = k->median_s(), ratio = step_s / bound;
    // The same ratio within each round (its four steps ran within seconds of each other): the
    // load here drifts on that scale, so the spread of these says how far `ratio` can be trusted.
    std::vector<double> rounds, quiet;
    for (int r = 0; r < o.iters; ++r) {
      rounds.push_back(k->secs[r] / std::max(compute->secs[r], io->secs[r]));
      // Quiet: none of the round's three steps lost more than a tenth of one vCPU to steal. Steal
      // lands in whichever step runs then, so a round it hit says nothing either way.
      auto calm = [&](const OffloadCase& c) { return c.steal_s[r] <= 0.1 * c.secs[r]; };
      if (calm(*k) && calm(*compute) && calm(*io)) quiet.push_back(rounds.back());
    }
    // Overlap: the share of the shorter of compute and I/O that ran under the other.
    double overlap = (compute_s + io_s - step_s) / std::min(compute_s, io_s);
    if (human)
      std::fprintf(human, "%10s %10.3f %16.3f %12.3f %8.2f %7.0f%% %7.2f+%.2f   (rounds' ratios %.2f..%.2f, median %.2f; steal %.2f s; %zu quiet rounds%s)\n",
                   label, step_s, compute_s, io_s, ratio, 100 * overlap, median(k->user_s), median(k->sys_s),
                   *std::min_element(rounds.begin(), rounds.end()), *std::max_element(rounds.begin(), rounds.end()),
                   median(rounds), median(k->steal_s), quiet.size(),
                   quiet.empty() ? "" : fmt::format(", median {:.2f}", median(quiet)).c_str());
    results.push_back({{"case", fmt::format("{}, scheduler {}", shape, label)}, {"step_s", step_s},
                       {"compute_only_s", compute_s}, {"io_only_s", io_s}, {"ratio", ratio}, {"overlap", overlap},
                       {"device_budget_bytes", budget}, {"peak_device_bytes", k->peak_device()},
                       {"state_bytes", state}, {"threads", threads}, {"checksums", o.checksums},
                       {"aio_block_size", o.aio_block_size}, {"aio_queue_depth", o.aio_queue_depth},
                       {"cpu_user_s", median(k->user_s)}, {"cpu_sys_s", median(k->sys_s)},
                       {"compute_only_cpu_s", median(compute->user_s) + median(compute->sys_s)},
                       {"nvme_read_mb", median(k->read_mb)}, {"nvme_written_mb", median(k->written_mb)},
                       {"io_thread_hashed_mb", median(k->io_hashed_mb)},
                       {"nvme_forwarded_mb", median(k->forwarded_mb)}, {"round_ratios", rounds},
                       {"steal_s", median(k->steal_s)}, {"compute_only_steal_s", median(compute->steal_s)},
                       {"round_ratio_median", median(rounds)},
                       {"quiet_round_ratios", quiet},
                       {"quiet_round_ratio_median", quiet.empty() ? nlohmann::json() : nlohmann::json(median(quiet))}});
  }
  if (human)
    for (const auto& [label, k] : {std::pair<const char*, OffloadCase*>{"compute only", compute.get()}, {"io only", io.get()}})
      std::fprintf(human, "%s: cpu_s %.2f+%.2f a step (the machine's vCPUs lost %.2f s to steal)\n", label,
                   median(k->user_s), median(k->sys_s), median(k->steal_s));
  if (human)
    std::fprintf(human,
                 "NVMe traffic during the offloaded step (scheduler on): read %.0f MB, written %.0f MB, %.0f MB "
                 "of reads served from pending writes; the I/O thread hashed %.0f MB\n",
                 median(on->read_mb), median(on->written_mb), median(on->forwarded_mb), median(on->io_hashed_mb));
  if (human)
    std::fprintf(human, "device peak %.1f MB of a %.1f MB budget%s\n", on->peak_device() / 1e6, budget / 1e6,
                 o.trace_path.empty() ? "" : ("; trace of one step (scheduler on): " + o.trace_path).c_str());
  if (out) *out = {{"bench", "offload"}, {"trace", o.trace_path}, {"results", results}};
  return Status::Ok();
}

}  // namespace zoe

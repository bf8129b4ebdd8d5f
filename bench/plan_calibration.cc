#include "plan_calibration.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <stdlib.h>

#include <tbb/task_arena.h>

#include <fmt/format.h>

#include "common/profiler.h"
#include "kernels/adam.h"
#include "model/gpt2_model.h"
#include "nvme_bench.h"
#include "sched/zero_engine.h"
#include "train/backend.h"
#include "train/engine_options.h"
#include "train/trainer.h"

namespace zoe {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The CPU Adam over n fp32 elements of state with gradients and weights in the job's dtype, best
// of three: elements a second on all the process's threads.
double measure_adam(DType dtype) {
  const size_t n = size_t{16} << 20;
  std::vector<float> master(n, 0.5f), m(n, 0.f), v(n, 0.f);
  std::vector<uint16_t> grad(n, 0x3c00), param(n, 0);
  std::vector<float> grad32(dtype == DType::kF32 ? n : 0, 1e-3f);
  AdamRange r;
  r.grad = dtype == DType::kF32 ? static_cast<const void*>(grad32.data()) : grad.data();
  r.grad_dtype = dtype;
  r.master = master.data();
  r.exp_avg = m.data();
  r.exp_avg_sq = v.data();
  r.param_out = dtype == DType::kF32 ? nullptr : param.data();
  r.param_dtype = dtype;
  r.n = n;
  AdamHyper h;
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = now_s();
    adam_step(h, r, best_isa(), 0);
    if (rep > 0) best = std::min(best, now_s() - t0);
  }
  return double(n) / best;
}

// memcpy of 256 MiB, best of three after a warm-up: bytes a second.
double measure_copy() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = now_s();
    std::memcpy(b.data(), a.data(), n);
    if (rep > 0) best = std::min(best, now_s() - t0);
  }
  return double(n) / best;
}

// The store's read and write rates at the best of its 1 MiB cases, on a 512 MiB file in a
// directory it makes for itself under `path` (mkdtemp: never one that was there) and removes.
Result<nlohmann::json> measure_nvme(const std::string& path) {
  NvmeBenchOptions o;
  std::string tmpl = (std::filesystem::path(path) / "zoe-plan-calibration-XXXXXX").string();
  if (!::mkdtemp(tmpl.data()))
    return Status::Io("cannot make a calibration directory under " + path + ": " + std::strerror(errno));
  o.dir = tmpl;
  o.file_bytes = uint64_t{512} << 20;
  o.block_sizes = {1u << 20};
  o.queue_depths = {8, 32};
  o.reps = 1;
  o.checksum_rows = false;
  o.fio = "/nonexistent/fio";  // zoe's rates only: the referee is `zoe bench nvme`'s business
  nlohmann::json out;
  Status st = bench_nvme(o, &out, nullptr);
  std::error_code ec;
  std::filesystem::remove_all(o.dir, ec);
  ZOE_RETURN_IF_ERROR(st);
  // The depth whose read and write together move a byte each way fastest.
  std::map<unsigned, std::pair<double, double>> by_depth;
  for (const auto& r : out["results"]) {
    if (!r["zoe_GBps"].is_number()) continue;
    auto& rw = by_depth[r["queue_depth"].get<unsigned>()];
    (r["op"] == "read" ? rw.first : rw.second) = r["zoe_GBps"].get<double>() * 1e9;
  }
  double best = 0;
  nlohmann::json pick;
  for (const auto& [qd, rw] : by_depth)
    if (rw.first > 0 && rw.second > 0 && 1 / (1 / rw.first + 1 / rw.second) > best) {
      best = 1 / (1 / rw.first + 1 / rw.second);
      pick = {{"read_Bps", rw.first}, {"write_Bps", rw.second}, {"block_size", 1 << 20}, {"queue_depth", qd}};
    }
  if (pick.is_null()) return Status::Runtime("the NVMe store moved nothing on " + path);
  return pick;
}

}  // namespace

PlanCalibration::PlanCalibration(const Config& job, PlanCalibrationOptions o) : job_(job), o_(std::move(o)) {
  std::ifstream f(o_.cache_path);
  if (f) cache_ = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!cache_.is_object()) cache_ = nlohmann::json::object();
}

std::string PlanCalibration::machine_key() {
  return fmt::format("{} / {} threads / {}", cpu_model(), tbb::this_task_arena::max_concurrency(),
                     isa_name(best_isa()));
}

Result<PlanRates> PlanCalibration::rates() {
  nlohmann::json& m = cache_[machine_key()];
  const std::string path = job_.offload_optimizer.nvme_path.empty() ? job_.offload_param.nvme_path
                                                                     : job_.offload_optimizer.nvme_path;
  auto say = [&](const char* what, const std::string& text, bool cached) {
    if (o_.human) std::fprintf(o_.human, "  %-18s %s%s\n", what, text.c_str(), cached ? " (cached)" : "");
  };
  const std::string dkey = std::string("adam_") + std::string(dtype_name(job_.dtype));
  bool cached = !o_.recalibrate && m.contains(dkey);
  if (!cached) m[dkey] = measure_adam(job_.dtype);
  say("cpu adam", fmt::format("{:.0f} M elements/s", m[dkey].get<double>() / 1e6), cached);
  cached = !o_.recalibrate && m.contains("copy_Bps");
  if (!cached) m["copy_Bps"] = measure_copy();
  say("host copy", fmt::format("{:.1f} GB/s", m["copy_Bps"].get<double>() / 1e9), cached);
  PlanRates r;
  r.adam_elems_per_s = m[dkey];
  r.host_copy_Bps = m["copy_Bps"];
  if (!path.empty()) {
    const std::string canon = std::filesystem::weakly_canonical(path).string();
    cached = !o_.recalibrate && m["nvme"].contains(canon);
    if (!cached) {
      std::filesystem::create_directories(path);
      ZOE_ASSIGN_OR_RETURN(m["nvme"][canon], measure_nvme(path));
    }
    const nlohmann::json& n = m["nvme"][canon];
    say("nvme", fmt::format("read {:.2f} GB/s, write {:.2f} GB/s at depth {} ({})", n["read_Bps"].get<double>() / 1e9,
                            n["write_Bps"].get<double>() / 1e9, n["queue_depth"].get<int>(), canon),
        cached);
    r.nvme_read_Bps = n["read_Bps"];
    r.nvme_write_Bps = n["write_Bps"];
  }
  return r;
}

std::string PlanCalibration::model_key(int b, bool ckpt) const {
  return fmt::format("gpt2 C{} H{} V{} T{} {} {} B{}{}", job_.n_embd, job_.n_head, job_.vocab_size, job_.seq_len,
                     dtype_name(job_.dtype), resolve_compute_dtype(job_), b, ckpt ? " ckpt" : "");
}

// One and two blocks of the job's width, resident on a CPU device at stage 0: the spans of the
// second micro-step give each unit's compute, the device ledger the model's buffers.
Result<PlanCalibration::UnitTimes> PlanCalibration::measure_model(int b, bool ckpt) {
  UnitTimes t;
  double act[2] = {0, 0};
  for (int layers : {1, 2}) {
    Config c = job_;
    c.n_layer = layers;
    c.stage = 0;
    c.offload_optimizer = c.offload_param = OffloadConfig{};
    c.device = "cpu";
    // Room for the state and any activations: an arena's reservation, touched only as used.
    c.device_memory_budget = uint64_t{16} * 2 * gpt2::total_numel({layers, c.n_head, c.n_embd, c.vocab_size,
                                                                    c.n_positions}) + (uint64_t{64} << 30);
    c.micro_batch = b;
    auto comm = make_self_comm();
    ZOE_ASSIGN_OR_RETURN(Backend be, make_backend(c, *comm));
    gpt2::Gpt2Shape s{layers, c.n_head, c.n_embd, c.vocab_size, c.n_positions};
    Gpt2Model model(s, ckpt, resolve_compute_dtype(c) == "bf16");
    ZeroEngine e(engine_options(c), *be.device, *comm, model.units());
    ZOE_RETURN_IF_ERROR(e.allocate());
    ZOE_RETURN_IF_ERROR(init_params(e, model, c.seed));
    Batch batch;
    batch.B = b;
    batch.T = c.seq_len;
    batch.inputs.assign(size_t(b) * c.seq_len, 1);
    batch.targets.assign(size_t(b) * c.seq_len, 2);
    // Warm (buffers, pages), then the device's peak over a micro-step beside the state: the
    // model's buffers and whatever the engine holds for a moment at its hand-overs.
    ZOE_RETURN_IF_ERROR(model.train_micro_step(e, batch, 1.0f).status());
    Ledger& ledger = be.device->ledger();
    ledger.reset_peaks();
    ZOE_RETURN_IF_ERROR(model.train_micro_step(e, batch, 1.0f).status());
    const LedgerSnapshot l = ledger.snapshot();
    act[layers - 1] = double(l.peak[0] - l.persistent(Tier::kDevice));
    if (layers == 1 && job_.n_layer > 1) continue;
    // The fastest of at least three timed micro-steps and 0.3 s of them (at most ten).
    Profiler& p = Profiler::get();
    const bool was = p.tracing();
    UnitTimes best;
    double best_total = 1e300, spent = 0;
    for (int rep = 0; rep < 10 && (rep < 3 || spent < 0.3); ++rep) {
      p.enable_trace(true);
      const double t0 = p.now_us();
      Status st = model.train_micro_step(e, batch, 1.0f).status();
      p.enable_trace(was);
      ZOE_RETURN_IF_ERROR(st);
      const double wall = (p.now_us() - t0) / 1e6;
      spent += wall;
      UnitTimes r;
      for (const TraceEvent& ev : p.events()) {
        if (ev.ts_us < t0 || std::strcmp(ev.cat, "compute") != 0) continue;
        const double s_ = ev.dur_us / 1e6;
        const bool bwd = ev.name.size() > 9 && ev.name.compare(ev.name.size() - 9, 9, " backward") == 0;
        if (ev.name.rfind("block ", 0) == 0) (bwd ? r.block_b : r.block_f) += s_ / layers;
        else if (ev.name.rfind("encoder", 0) == 0) (bwd ? r.encoder_b : r.encoder_f) += s_;
        else (bwd ? r.head_b : r.head_f) += s_;  // ln_f and the LM head
      }
      if (!was) p.clear_events();
      // What the spans leave out (fetches, the gradients' hand-over, the loss) goes to each unit
      // in proportion: the micro-step's wall time is what the plan adds up.
      const double spans = r.encoder_f + r.encoder_b + layers * (r.block_f + r.block_b) + r.head_f + r.head_b;
      const double k = spans > 0 ? wall / spans : 1;
      for (double* x : {&r.encoder_f, &r.encoder_b, &r.block_f, &r.block_b, &r.head_f, &r.head_b}) *x *= k;
      if (wall < best_total) best_total = wall, best = r;
    }
    t.encoder_f = best.encoder_f, t.encoder_b = best.encoder_b, t.block_f = best.block_f, t.block_b = best.block_b;
    t.head_f = best.head_f, t.head_b = best.head_b;
  }
  t.act_block = job_.n_layer > 1 ? act[1] - act[0] : 0;
  t.act_fixed = act[0] - t.act_block;
  return t;
}

Result<MicroStepWork> PlanCalibration::micro_step(int b, bool ckpt) {
  nlohmann::json& models = cache_[machine_key()]["models"];
  const std::string key = model_key(b, ckpt);
  const bool cached = !o_.recalibrate && models.contains(key);
  if (!cached) {
    ZOE_ASSIGN_OR_RETURN(UnitTimes u, measure_model(b, ckpt));
    models[key] = {{"encoder_f", u.encoder_f}, {"block_f", u.block_f}, {"head_f", u.head_f},
                   {"encoder_b", u.encoder_b}, {"block_b", u.block_b}, {"head_b", u.head_b},
                   {"act_fixed", u.act_fixed}, {"act_block", u.act_block}};
  }
  const nlohmann::json& u = models[key];
  const int L = job_.n_layer;
  MicroStepWork w;
  // GPT-2's fetches: embedding, blocks, ln_f, the tied head (unit 0 again, held into the
  // backward), then ln_f, the blocks in reverse and the embedding's gradient.
  w.fetches.push_back({0, u["encoder_f"].get<double>(), false});
  for (int l = 0; l < L; ++l) w.fetches.push_back({1 + l, u["block_f"].get<double>(), false});
  w.fetches.push_back({L + 1, 0.0, false});
  w.fetches.push_back({0, u["head_f"].get<double>() + u["head_b"].get<double>(), false});
  w.fetches.push_back({L + 1, 0.0, true});
  for (int l = L - 1; l >= 0; --l) w.fetches.push_back({1 + l, u["block_b"].get<double>(), true});
  w.fetches.push_back({0, u["encoder_b"].get<double>(), true});
  w.activation_bytes = static_cast<uint64_t>(std::max(0.0, u["act_fixed"].get<double>() + L * u["act_block"].get<double>()));
  w.tokens = int64_t{b} * job_.seq_len;
  if (o_.human && !cached) {
    double f = 0, bw = 0;
    for (const PlanFetch& x : w.fetches) (x.backward ? bw : f) += x.compute_s;
    std::fprintf(o_.human, "  %-18s B=%d%s: forward %.3f s, backward %.3f s, activations %.2f GB (measured)\n",
                 "micro-step", b, ckpt ? " checkpointed" : "", f, bw, w.activation_bytes / 1e9);
  }
  return w;
}

Status PlanCalibration::save() const {
  std::error_code ec;
  const auto dir = std::filesystem::path(o_.cache_path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  const std::string tmp = o_.cache_path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) return Status::Io("cannot write the plan's calibration cache " + tmp + ": " + std::strerror(errno));
    f << cache_.dump(2) << "\n";
    if (!f) return Status::Io("writing the plan's calibration cache " + tmp + " failed");
  }
  std::filesystem::rename(tmp, o_.cache_path, ec);
  if (ec) return Status::Io("cannot put the plan's calibration cache in place at " + o_.cache_path + ": " + ec.message());
  return Status::Ok();
}

}  // namespace zoe

#include "step_bench.h"

#include <sys/wait.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_engine.h"
#include "bench_process.h"
#include "common/config.h"
#include "common/profiler.h"
#include "kernels/adam.h"
#include "kernels/gemm.h"
#include "comm/comm.h"
#include "model/gpt2_model.h"
#include "train/backend.h"
#include "sched/zero_engine.h"
#include "train/batch_source.h"
#include "zoe/engine.h"
#include "bench_stats.h"

namespace zoe {
namespace {

// Both sides train on the embedded corpus (one token per byte, llm.c order) with these AdamW
// settings (nanoGPT's usual values).
constexpr double kLr = 3e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1, kClip = 1.0;

using Timing = StepTiming;

}  // namespace

Result<StepTiming> time_zoe_step(const StepBenchOptions& o, int threads) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  Config c;
  c.stage = o.stage;
  c.dtype = o.bf16 ? DType::kBF16 : DType::kF32;
  c.compute_dtype = o.bf16 ? "bf16" : "fp32";
  c.allow_tf32 = o.allow_tf32;
  c.micro_batch = o.B;
  c.lr = kLr, c.beta1 = kBeta1, c.beta2 = kBeta2, c.eps = kEps, c.weight_decay = kWeightDecay;
  c.grad_clip = kClip;
  c.device = o.device;
  c.device_memory_budget = o.device_budget;
  c.host_memory_budget = uint64_t{16} << 30;
  if (!o.nvme_dir.empty()) {
    c.stage = 3;
    for (OffloadConfig* oc : {&c.offload_param, &c.offload_optimizer}) {
      oc->device = OffloadDevice::kNvme;
      oc->nvme_path = o.nvme_dir;
    }
  }
  auto comm = make_self_comm();
  Gpt2Model model(o.shape, /*activation_checkpointing=*/false, o.bf16);
  ZOE_ASSIGN_OR_RETURN(BenchEngine be, make_bench_engine(c, *comm, model));
  Device& dev = *be.backend.device;
  auto& engine = be.engine;
  ZOE_ASSIGN_OR_RETURN(auto source, make_token_source(kBenchCorpus, "bytes", o.shape.vocab_size, o.B, o.T, 0, 1));
  Timing t;
  std::vector<double> secs;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    ZOE_ASSIGN_OR_RETURN(Batch b, source->next());
    Profiler::get().take_step_times();
    if (o.op_times) (void)dev.ops().take_op_seconds();  // from this step on
    const uint64_t up0 = dev.copied_bytes(Stream::kH2D), down0 = dev.copied_bytes(Stream::kD2H);
    const ZeroEngine::SchedStats io0 = engine->sched_stats();
    auto t0 = std::chrono::steady_clock::now();
    ZOE_ASSIGN_OR_RETURN(double loss, model.train_micro_step(*engine, b, 1.0f));
    ZOE_ASSIGN_OR_RETURN(StepResult r, engine->step(kLr));
    (void)r;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto buckets = Profiler::get().take_step_times();
    if (i == 0) t.first_loss = loss;
    t.last_loss = loss;
    if (i < o.warmup) continue;
    if (o.op_times)
      for (const auto& [op, sec] : dev.ops().take_op_seconds()) t.op_s[op] += sec / o.iters;
    secs.push_back(s);
    const ZeroEngine::SchedStats io1 = engine->sched_stats();
    t.h2d_bytes += double(dev.copied_bytes(Stream::kH2D) - up0) / o.iters;
    t.d2h_bytes += double(dev.copied_bytes(Stream::kD2H) - down0) / o.iters;
    t.nvme_read_bytes += double(io1.nvme_read_bytes - io0.nvme_read_bytes) / o.iters;
    t.nvme_written_bytes += double(io1.nvme_written_bytes - io0.nvme_written_bytes) / o.iters;
    t.forward += buckets[int(Bucket::kForward)] / o.iters;
    t.backward += buckets[int(Bucket::kBackward)] / o.iters;
    t.optimizer += buckets[int(Bucket::kOptimizer)] / o.iters;
  }
  t.params = gpt2::total_numel(o.shape);
  t.step_s = *std::min_element(secs.begin(), secs.end());
  t.median_s = median(secs);
  LedgerSnapshot l = dev.ledger().snapshot();
  t.peak_device_bytes = l.peak[int(Tier::kDevice)];
  t.persistent_device_bytes = l.persistent(Tier::kDevice);
  return t;
}

Result<std::string> find_torch_python(const StepBenchOptions& o) {
  if (!o.python.empty()) return o.python;
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    int rc = 0;
    auto out = run_capture(fmt::format("{} -c 'import torch' 2>/dev/null", py), &rc);
    if (out.ok() && rc == 0) return std::string(py);
  }
  return Status::Unsupported("bench step: no python3 that imports torch (install Debian's python3-torch, "
                             "or pass --python PATH, or --no-torch)");
}

// The same model trained by PyTorch (bench/torch_gpt2_step.py prints one JSON line last). Its
// OpenMP and OpenBLAS pools get the same thread count as zoe's. passive: OMP_WAIT_POLICY=PASSIVE
// (spinning workers on a shared machine once made torch's optimizer step 20x slower here);
// otherwise OpenMP's default, as torch's users run it.
Result<nlohmann::json> time_torch_step(const StepBenchOptions& o, const std::string& py, int threads,
                                       const std::string& mode, bool passive) {
  const auto& s = o.shape;
  std::string cmd = fmt::format(
      "OMP_NUM_THREADS={0} OPENBLAS_NUM_THREADS={0} {21}{1} {2}/bench/torch_gpt2_step.py "
      "--n_layer {3} --n_head {4} --n_embd {5} --vocab_size {6} --n_positions {7} --B {8} --T {9} "
      "--threads {0} --warmup {10} --iters {11} --lr {12} --beta1 {13} --beta2 {14} --eps {15} --weight_decay {16} "
      "--clip {17} --data {18} --device {19} --mode {20}",
      threads, py, ZOE_SOURCE_DIR, s.n_layer, s.n_head, s.n_embd, s.vocab_size, s.n_positions, o.B, o.T, o.warmup,
      o.iters, kLr, kBeta1, kBeta2, kEps, kWeightDecay, kClip, kBenchCorpus, o.device == "cuda" ? "cuda" : "cpu", mode,
      passive ? "OMP_WAIT_POLICY=PASSIVE " : "");
  int rc = 0;
  ZOE_ASSIGN_OR_RETURN(std::string out, run_capture(cmd, &rc));
  size_t at = out.rfind("\n{");
  at = at == std::string::npos ? out.find('{') : at + 1;
  if (rc != 0 || at == std::string::npos)
    return Status::Runtime(fmt::format("bench step: the PyTorch side failed (exit {}): {}\n{}", rc, cmd, out));
  auto j = nlohmann::json::parse(out.substr(at), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Runtime("bench step: the PyTorch side printed no JSON:\n" + out);
  return j;
}

double step_gemm_flops(const StepBenchOptions& o) {
  const double N = double(o.B) * o.T, C = o.shape.n_embd;
  // Per block qkv (C x 3C), attention projection (C x C), fc (C x 4C), projection (4C x C); then
  // the tied head (C x V). The backward's dinp and dW are each the forward's product again.
  const double forward = o.shape.n_layer * 24.0 * N * C * C + 2.0 * N * C * o.shape.vocab_size;
  return 3 * forward;
}

Result<double> gemm_peak_gflops(GemmPath p, GemmType t, int threads) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  constexpr int n = 1024;
  const size_t esize = t == GemmType::kBF16 ? 2 : 4;
  std::vector<char> a(size_t(n) * n * esize), b(size_t(n) * n * esize);
  std::vector<float> c(size_t(n) * n, 0.f);
  for (size_t i = 0; i < a.size(); i += esize) {  // small values, so no denormal or overflow
    float v = float(i % 97) / 97.f - 0.5f;
    if (esize == 2) {
      uint16_t h = f32_to_bf16(v);
      std::memcpy(&a[i], &h, 2);
      std::memcpy(&b[i], &h, 2);
    } else {
      std::memcpy(&a[i], &v, 4);
      std::memcpy(&b[i], &v, 4);
    }
  }
  GemmShape s{false, false, n, n, n, n, n, n};
  // The best of at least 12 products and half a second after two warm-ups (each worker's first
  // slice makes its oneDNN primitive): a peak, on a machine whose neighbours come and go.
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 14 || spent < 0.5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    ZOE_RETURN_IF_ERROR(gemm_sliced(p, t, s, a.data(), b.data(), 0.f, c.data()));
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 2) best = std::min(best, dt), spent += dt;
  }
  return 2.0 * n * n * n / best / 1e9;
}

// Each path this build and CPU have for each type, marking the one the model uses. oneDNN goes
// first: its products run at half speed in a process where OpenBLAS's ran before its first large
// one (kernels/gemm.h), and a peak is what the library can do.
Result<nlohmann::json> gemm_peaks(int threads) {
  nlohmann::json rows = nlohmann::json::array();
  for (GemmType t : {GemmType::kF32, GemmType::kBF16}) {
    ZOE_ASSIGN_OR_RETURN(GemmPath chosen, gemm_path(t));
    for (GemmPath p : {GemmPath::kOneDnn, GemmPath::kOpenBlas}) {
      if (!gemm_supported(p, t)) continue;
      ZOE_ASSIGN_OR_RETURN(double gf, gemm_peak_gflops(p, t, threads));
      rows.push_back({{"type", gemm_type_name(t)}, {"path", gemm_path_name(p)}, {"chosen", p == chosen},
                      {"threads", threads}, {"gflops", gf}, {"shape", "1024^3, sliced as the model's"}});
    }
  }
  return rows;
}

double chosen_peak(const nlohmann::json& peaks, const char* type) {
  for (const auto& r : peaks)
    if (r["type"] == type && r["chosen"].get<bool>()) return r["gflops"].get<double>();
  return 0;
}

// The PyTorch modes of the same run: eager fp32 (the baseline), autocast to bf16 where the CPU
// has bf16 units (elsewhere it measures a conversion, not the hardware), torch.compile where
// this torch has it, fp32 and under the same autocast (the strongest bf16 peer).
Result<nlohmann::json> torch_modes(const StepBenchOptions& o, const std::string& py, int threads) {
  nlohmann::json modes;
  for (std::string m : {"eager", "autocast_bf16", "compile", "compile_autocast_bf16"}) {
    if (m.ends_with("autocast_bf16") && o.device != "cuda" && !isa_has_avx512bf16()) {
      modes[m] = {{"skipped", "this CPU has no bf16 units (AVX512-BF16 or AMX): autocast would time conversions"}};
      continue;
    }
    // The peer at its best: OpenMP's default wait policy (how torch's users run it) and PASSIVE,
    // the faster kept and named (on an AMX machine the default ran 1.19x faster; on a shared
    // 2-vCPU VM PASSIVE has been).
    ZOE_ASSIGN_OR_RETURN(auto by_default, time_torch_step(o, py, threads, m, /*passive=*/false));
    ZOE_ASSIGN_OR_RETURN(auto passive, time_torch_step(o, py, threads, m, /*passive=*/true));
    auto step_s = [](const nlohmann::json& r) {  // a mode this torch lacks reports no time
      return r.contains("step_s") && r["step_s"].is_number() ? r["step_s"].get<double>() : 1e300;
    };
    bool default_won = step_s(by_default) <= step_s(passive);
    modes[m] = default_won ? by_default : passive;
    if (step_s(modes[m]) == 1e300) continue;
    modes[m]["omp_wait_policy"] = default_won ? "default" : "PASSIVE";
    modes[m]["other_policy_step_s"] = (default_won ? passive : by_default)["step_s"];
  }
  return modes;
}

namespace {

void print_header(std::FILE* human, const StepBenchOptions& o, const std::string& model) {
  std::fprintf(human,
               "# %s, %.1fM params, %s, 1 rank, ZeRO stage %d, AdamW; best of %d steps after %d warm-up%s\n"
               "# baseline: %s\n"
               "%7s %12s %12s %7s   %-24s %-24s\n",
               model.c_str(), gpt2::total_numel(o.shape) / 1e6, o.bf16 ? "bf16 (bf16 compute)" : "fp32", o.stage,
               o.iters, o.warmup, o.torch ? " (zoe: the faster of a run before the peer's and one after)" : "",
               o.torch ? "PyTorch training the same model (bench/torch_gpt2_step.py; each mode the faster of OpenMP's "
                         "default wait policy and PASSIVE, named in --json's omp_wait_policy)"
                       : "none (--no-torch)",
               "threads", "zoe tok/s",
               "torch tok/s", "ratio", "zoe fwd/bwd/opt ms", "torch fwd/bwd/opt ms");
}

// One case of the contract's "results": measured = zoe's tokens/s, baseline = torch's (null
// without torch), ratio = measured / baseline.
nlohmann::json result_row(const std::string& model, int threads, double tokens, const Timing& z,
                          const nlohmann::json& modes, double gemm_flops, double peak) {
  double measured = tokens / z.step_s;
  nlohmann::json baseline, ratio, best, best_ratio, torch;
  if (!modes.is_null()) {
    torch = modes["eager"];
    baseline = tokens / torch["step_s"].get<double>();
    ratio = measured / baseline.get<double>();
    double fastest = 1e30;
    for (const auto& [m, r] : modes.items())
      if (r.contains("step_s")) fastest = std::min(fastest, r["step_s"].get<double>());
    best = tokens / fastest;
    best_ratio = measured / best.get<double>();
  }
  double gflops = gemm_flops / z.step_s / 1e9;
  // The products' own time (every matmul_* and lm_head_* op, their rounding and bias passes
  // included) and the step's ceiling on this machine: its products at the measured peak and
  // nothing else, tokens / (GEMM FLOPs / peak). No schedule of the same FLOPs beats it.
  double products_s = 0;
  for (const auto& [op, s] : z.op_s)
    if (op.rfind("matmul_", 0) == 0 || op.rfind("lm_head_", 0) == 0) products_s += s;
  nlohmann::json products_frac, ceiling, ceiling_ratio;
  if (products_s > 0 && peak > 0) products_frac = gemm_flops / products_s / 1e9 / peak;
  if (peak > 0) ceiling = tokens / (gemm_flops / (peak * 1e9));
  if (peak > 0 && !best.is_null()) ceiling_ratio = ceiling.get<double>() / best.get<double>();
  return {{"case", fmt::format("{} threads {}", model, threads)}, {"threads", threads}, {"measured", measured},
          {"baseline", baseline}, {"ratio", ratio}, {"unit", "tokens/s"}, {"step_s", z.step_s},
          {"median_step_s", z.median_s},
          {"time_s", {{"forward", z.forward}, {"backward", z.backward}, {"optimizer", z.optimizer}}},
          {"loss", {z.first_loss, z.last_loss}}, {"torch", torch}, {"torch_modes", modes}, {"op_s", z.op_s},
          {"best_torch", best}, {"ratio_to_best_torch", best_ratio},
          {"gemm_gflops", gflops}, {"gemm_fraction_of_peak", peak > 0 ? nlohmann::json(gflops / peak) : nlohmann::json()},
          {"products_s", products_s}, {"products_fraction_of_peak", products_frac},
          {"ceiling_tokens_per_s", ceiling}, {"ceiling_ratio_to_best_torch", ceiling_ratio}};
}

void print_row(std::FILE* human, const nlohmann::json& r, const Timing& z) {
  const auto& t = r["torch"];
  bool base = !t.is_null();
  std::string zb = fmt::format("{:.1f}/{:.1f}/{:.1f}", z.forward * 1e3, z.backward * 1e3, z.optimizer * 1e3);
  std::string tb = base ? fmt::format("{:.1f}/{:.1f}/{:.1f}", t["forward_s"].get<double>() * 1e3,
                                      t["backward_s"].get<double>() * 1e3, t["optimizer_s"].get<double>() * 1e3)
                        : "-";
  std::string bs = base ? fmt::format("{:.0f}", r["baseline"].get<double>()) : "-";
  std::string rs = base ? fmt::format("{:.2f}", r["ratio"].get<double>()) : "-";
  std::fprintf(human, "%7d %12.0f %12s %7s   %-24s %-24s\n", r["threads"].get<int>(), r["measured"].get<double>(),
               bs.c_str(), rs.c_str(), zb.c_str(), tb.c_str());
  std::string frac = r["gemm_fraction_of_peak"].is_null() ? "-" : fmt::format("{:.2f}", r["gemm_fraction_of_peak"].get<double>());
  std::fprintf(human, "%7s zoe's GEMMs: %.1f GFLOP/s, %s of the %s peak\n", "", r["gemm_gflops"].get<double>(),
               frac.c_str(), r["gemm_peak_type"].get<std::string>().c_str());
  if (!r["products_fraction_of_peak"].is_null())
    std::fprintf(human, "%7s zoe's products in their own time: %.1f ms a step, %.2f of the peak\n", "",
                 r["products_s"].get<double>() * 1e3, r["products_fraction_of_peak"].get<double>());
  if (!r["ceiling_tokens_per_s"].is_null()) {
    std::string vs = r["ceiling_ratio_to_best_torch"].is_null()
                         ? ""
                         : fmt::format(", {:.2f}x the best torch row", r["ceiling_ratio_to_best_torch"].get<double>());
    std::fprintf(human, "%7s ceiling (the products at the peak, nothing else): %.0f tok/s%s\n", "",
                 r["ceiling_tokens_per_s"].get<double>(), vs.c_str());
  }
  // Where the step's compute goes, op by op (the device's timing; empty on a GPU).
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [op, s] : z.op_s) ops.emplace_back(s, op);
  std::sort(ops.rbegin(), ops.rend());
  std::string list;
  for (const auto& [s, op] : ops) list += fmt::format("{}{} {:.1f}", list.empty() ? "" : ", ", op, s * 1e3);
  if (!list.empty()) std::fprintf(human, "%7s zoe per op, ms per step: %s\n", "", list.c_str());
  const double tokens = r["measured"].get<double>() * r["step_s"].get<double>();
  if (base)
    for (const auto& [m, v] : r["torch_modes"].items()) {
      std::string what = v.contains("step_s") ? fmt::format("{:.0f} tok/s", tokens / v["step_s"].get<double>())
                                              : v.value("unsupported", v.value("skipped", std::string("-")));
      std::fprintf(human, "%7s torch %s: %s\n", "", m.c_str(), what.c_str());
    }
  if (base && !r["ratio_to_best_torch"].is_null())
    std::fprintf(human, "%7s zoe / the best torch row (%.0f tok/s): %.2f\n", "", r["best_torch"].get<double>(),
                 r["ratio_to_best_torch"].get<double>());
}

}  // namespace

Status bench_step(const StepBenchOptions& o, nlohmann::json* out, std::FILE* human) {
  ZOE_RETURN_IF_ERROR(gpt2::validate_shape(o.shape));
  if (o.T > o.shape.n_positions || o.B < 1 || o.iters < 1 || o.warmup < 0)
    return Status::Invalid("bench step: need 1 <= T <= n_positions, B >= 1, iters >= 1");
  std::vector<int> threads = o.threads;
  if (threads.empty()) threads = {static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};
  if (*std::min_element(threads.begin(), threads.end()) < 1) return Status::Invalid("--threads: expected >= 1");
  std::string py;
  if (o.torch) {
    ZOE_ASSIGN_OR_RETURN(py, find_torch_python(o));
  }
  const auto& s = o.shape;
  std::string model = fmt::format("gpt2 L{} C{} H{} V{} T{} B{}", s.n_layer, s.n_embd, s.n_head, s.vocab_size,
                                  o.T, o.B);
  if (human) print_header(human, o, model);
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json peaks = nlohmann::json::array();
  for (int n : threads) {
    ZOE_ASSIGN_OR_RETURN(nlohmann::json p, gemm_peaks(n));
    if (human)
      for (const auto& r : p)
        std::fprintf(human, "# gemm peak, %d thread(s), %s via %s%s: %.1f GFLOP/s\n", n,
                     r["type"].get<std::string>().c_str(), r["path"].get<std::string>().c_str(),
                     r["chosen"].get<bool>() ? " (chosen)" : "", r["gflops"].get<double>());
    ZOE_ASSIGN_OR_RETURN(Timing z, time_zoe_step(o, n));
    nlohmann::json modes, zoe_runs = nlohmann::json::array({z.step_s});
    if (o.torch) {
      ZOE_ASSIGN_OR_RETURN(modes, torch_modes(o, py, n));
      // zoe again after the peer, the faster run kept: the peer's best row is the best of eight
      // runs (four modes, two wait policies) spread over a minute, and on a shared VM a
      // neighbour's burst within zoe's one run of a few seconds moved the ratio by 0.2.
      ZOE_ASSIGN_OR_RETURN(Timing again, time_zoe_step(o, n));
      zoe_runs.push_back(again.step_s);
      if (again.step_s < z.step_s) z = std::move(again);
    }
    const char* type = o.bf16 ? "bf16" : "fp32";
    results.push_back(result_row(model, n, double(o.B) * o.T, z, modes, step_gemm_flops(o), chosen_peak(p, type)));
    results.back()["gemm_peak_type"] = type;
    results.back()["zoe_runs_step_s"] = zoe_runs;
    for (auto& r : p) peaks.push_back(r);
    if (human) print_row(human, results.back(), z);
  }
  if (out)
    *out = {{"bench", "step"},
            {"model", {{"n_layer", s.n_layer}, {"n_head", s.n_head}, {"n_embd", s.n_embd}, {"vocab_size", s.vocab_size},
                       {"n_positions", s.n_positions}, {"B", o.B}, {"T", o.T}}},
            {"params", gpt2::total_numel(s)}, {"stage", o.stage}, {"dtype", o.bf16 ? "bf16" : "fp32"}, {"ranks", 1},
            {"warmup", o.warmup}, {"iters", o.iters}, {"gemm_peak", peaks}, {"results", results}};
  return Status::Ok();
}

}  // namespace zoe

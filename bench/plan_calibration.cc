#include "plan_calibration.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include <stdlib.h>

#include <tbb/task_arena.h>

#include <fmt/format.h>

#include "comm/comm.h"
#include "common/profiler.h"
#include "kernels/adam.h"
#include "model/gpt2_model.h"
#include "bench_process.h"
#include "nvme/io_error.h"
#include "nvme_bench.h"
#include "sched/zero_engine.h"
#include "train/backend.h"
#include "train/engine_options.h"
#include "bench_engine.h"
#include "train/trainer.h"
#ifdef ZOE_HAVE_CUDA
#include "gpu/gpu_info.h"
#endif

namespace zoe {
namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The GPU a cuda job runs on, by name (the first: a machine's GPUs are alike).
std::string gpu_model() {
#ifdef ZOE_HAVE_CUDA
  std::string why;
  const std::vector<gpu::GpuInfo> gpus = gpu::list_gpus(&why);
  if (!gpus.empty()) return gpus.front().name;
  return "no GPU (" + why + ")";
#else
  return "no GPU (built without CUDA)";
#endif
}

// A device of its own (the job's GPU), through the Device interface as the engine uses it: its
// Adam over state in its memory (bf16 or fp32 gradients and weights as the job's, fp32 state), in
// elements a second, sized up until a call takes 20 ms (at most 64 M elements); pinned host <->
// device copies each way and a copy within its memory, 256 MiB, in bytes a second. Each within
// the job's device budget (a quarter of it for a copy's buffer, half for Adam's state).
Result<nlohmann::json> measure_gpu(const Config& job) {
  Config c = job;
  c.stage = 0;
  c.offload_optimizer = c.offload_param = OffloadConfig{};
  const size_t kCopy = std::min<size_t>(size_t{256} << 20, job.device_memory_budget / 4 >> 20 << 20);
  const size_t per = dtype_size(job.dtype) * (job.dtype == DType::kF32 ? 1 : 2) + 12;  // gradient, state, weight copy
  const size_t kMostAdam = std::min<size_t>(size_t{64} << 20, job.device_memory_budget / 2 / per);
  if (kCopy == 0 || kMostAdam < (size_t{1} << 16))
    return Status::Invalid("zoe.device_memory_budget " + bytes_text(job.device_memory_budget) +
                           " leaves no room to measure the GPU (4 MiB at least)");
  c.device_memory_budget = std::min<uint64_t>(job.device_memory_budget, kMostAdam * per + 2 * kCopy + (64 << 20));
  c.host_memory_budget = kCopy + (64 << 20);
  auto comm = make_self_comm();
  ZOE_ASSIGN_OR_RETURN(Backend be, make_backend(c, *comm));
  Device& dev = *be.device;
  nlohmann::json out;
  {
    ZOE_ASSIGN_OR_RETURN(Buffer host, dev.alloc(kCopy, Tier::kHost, Kind::kStaging));
    ZOE_ASSIGN_OR_RETURN(Buffer a, dev.alloc(kCopy, Tier::kDevice, Kind::kStaging));
    ZOE_ASSIGN_OR_RETURN(Buffer b, dev.alloc(kCopy, Tier::kDevice, Kind::kStaging));
    Status st = dev.zero(a.data, kCopy);
    if (st.ok()) st = dev.synchronize();  // the copies run on other streams
    std::memset(host.data, 0, kCopy);
    auto over = [&](const Buffer& dst, const Buffer& src, Stream s) -> Status {
      ZOE_RETURN_IF_ERROR(dev.copy_async(dst, 0, src, 0, kCopy, s));
      return dev.wait(dev.record(s));
    };
    struct Copy {
      const char* name;
      const Buffer *dst, *src;
      Stream stream;
    };
    for (const Copy& k : {Copy{"h2d_Bps", &a, &host, Stream::kH2D}, Copy{"d2h_Bps", &host, &a, Stream::kD2H},
                          Copy{"d2d_Bps", &b, &a, Stream::kCompute}}) {
      if (!st.ok()) break;
      Result<double> t = best_seconds(3, [&] { return over(*k.dst, *k.src, k.stream); });
      if (t.ok()) out[k.name] = double(kCopy) / *t;
      else st = t.status();
    }
    for (Buffer* x : {&host, &a, &b}) dev.free(*x);
    ZOE_RETURN_IF_ERROR(st);
  }
  const size_t w = dtype_size(job.dtype);
  for (size_t n = size_t{1} << 16;; n = std::min(n * 4, kMostAdam)) {
    ZOE_ASSIGN_OR_RETURN(Buffer state, dev.alloc(n * per + 8, Tier::kDevice, Kind::kStaging));
    char* at = state.as<char>();
    AdamRange r;
    r.grad = at;
    r.grad_dtype = job.dtype;
    r.master = reinterpret_cast<float*>(at + n * w);
    r.exp_avg = r.master + n;
    r.exp_avg_sq = r.exp_avg + n;
    r.param_out = job.dtype == DType::kF32 ? nullptr : static_cast<void*>(r.exp_avg_sq + n);
    r.param_dtype = job.dtype;
    r.n = n;
    AdamHyper h;
    auto* nonfinite = reinterpret_cast<uint64_t*>(at + n * per);
    Status st = dev.zero(state.data, n * per + 8);
    Result<double> t = st.ok() ? best_seconds(3, [&]() -> Status {
      ZOE_RETURN_IF_ERROR(dev.adam(h, &r, 1, nonfinite));
      return dev.synchronize();
    })
                               : Result<double>(st);
    dev.free(state);
    ZOE_RETURN_IF_ERROR(t.status());
    if (*t >= 0.02 || n >= kMostAdam) {
      out["adam_elems_per_s"] = double(n) / *t;
      break;
    }
  }
  return out;
}

// memcpy of 256 MiB, best of three after a warm-up: bytes a second.
double measure_copy() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  return double(n) / *best_seconds(3, [&] {
    std::memcpy(b.data(), a.data(), n);
    return Status::Ok();
  });
}

// The collectives' bus bandwidth over the ranks (nccl-tests' convention: the bytes each rank
// receives from the others over the time), 16 MiB a rank, best of three after a warm-up: the
// all-gather of bf16 parameters and the reduce-scatter of bf16 gradients the engine runs.
Result<std::pair<double, double>> measure_comm(Comm& comm) {
  const size_t n = comm.size(), chunk = size_t{16} << 20;
  std::vector<uint8_t> mine(chunk, 1), all(chunk * n, 0);
  double gather = 1e30, reduce = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    ZOE_RETURN_IF_ERROR(comm.barrier());
    double t0 = now_s();
    ZOE_RETURN_IF_ERROR(comm.all_gather(mine.data(), all.data(), chunk));
    if (rep > 0) gather = std::min(gather, now_s() - t0);
    std::fill(all.begin(), all.end(), 0);  // bf16 zeros: a sum of nothing in particular
    ZOE_RETURN_IF_ERROR(comm.barrier());
    t0 = now_s();
    ZOE_RETURN_IF_ERROR(comm.reduce_scatter(all.data(), mine.data(), chunk / 2, DType::kBF16));
    if (rep > 0) reduce = std::min(reduce, now_s() - t0);
  }
  const double moved = double(n - 1) * chunk;
  return std::make_pair(moved / gather, moved / reduce);
}

// The optimizer's pass over NVMe state through the engine itself: stage 3, parameters and
// optimizer state on NVMe under `path` (a directory it makes and removes) at `depth`, the job's
// checksums, clipping and sub-group size, 8 units of `elems` in all. Returns the pass's seconds
// an element (the gradients' hand-over, Adam, every read and write-back) and the parameters' read
// rate (a fetch of every unit), the better of steps 2 and 3 (step 1 reads blocks never written,
// which cost nothing).
Result<std::pair<double, double>> measure_pass(const Config& job, const std::string& path, unsigned depth,
                                                int64_t elems) {
  std::string tmpl = (std::filesystem::path(path) / "zoe-plan-pass-XXXXXX").string();
  if (!::mkdtemp(tmpl.data()))
    return Status::Io("cannot make a calibration directory under " + path + ": " + std::strerror(errno));
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{tmpl};
  const int64_t unit = std::max<int64_t>(1 << 17, elems / 8);
  std::vector<UnitSpec> units;
  for (int u = 0; u < 8; ++u) units.push_back(make_unit("u" + std::to_string(u), {{"w", {unit}}}));
  Config c = job;
  c.stage = 3;
  for (OffloadConfig* o : {&c.offload_optimizer, &c.offload_param}) {
    o->device = OffloadDevice::kNvme;
    o->nvme_path = tmpl;
    o->ratio = 1;
  }
  c.aio_queue_depth = static_cast<int>(depth);
  c.device = "cpu";
  c.device_memory_budget = uint64_t(unit) * 32 + (uint64_t{64} << 20);
  auto comm = make_self_comm();
  ZOE_ASSIGN_OR_RETURN(Backend be, make_backend(c, *comm));
  ZeroEngine e(engine_options(c), *be.device, *comm, units);
  ZOE_RETURN_IF_ERROR(e.allocate());
  ZOE_ASSIGN_OR_RETURN(Buffer zeros, be.device->alloc(size_t(unit) * 4, Tier::kDevice, Kind::kActivation));
  ZOE_RETURN_IF_ERROR(be.device->zero(zeros.data, zeros.bytes));
  double pass = 1e30, reads = 1e30;
  for (int s = 0; s < 3; ++s) {
    double t0 = now_s();
    for (int u = 0; u < 8; ++u) {
      ZOE_RETURN_IF_ERROR(e.fetch(u).status());
      ZOE_RETURN_IF_ERROR(e.release(u));
    }
    const double fetch = now_s() - t0;
    t0 = now_s();
    for (int u = 7; u >= 0; --u) ZOE_RETURN_IF_ERROR(e.grads_ready(u, zeros.as<float>()));
    ZOE_RETURN_IF_ERROR(e.step(1e-4).status());
    ZOE_RETURN_IF_ERROR(e.flush().status());
    if (s > 0) pass = std::min(pass, now_s() - t0), reads = std::min(reads, fetch);
  }
  be.device->free(zeros);
  return std::make_pair(pass / double(8 * unit), double(8 * unit) * dtype_size(job.dtype) / reads);
}

}  // namespace

// The CPU Adam over n fp32 elements of state with gradients and weights in the job's dtype, best
// of three: elements a second on all the process's threads.
double measure_cpu_adam(DType dtype) {
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
  return double(n) / *best_seconds(3, [&] {
    adam_step(h, r, best_isa(), 0);
    return Status::Ok();
  });
}

// The store's read and write rates at the best of its 1 MiB cases, on a file of `bytes` in a
// directory it makes for itself under `path` (mkdtemp: never one that was there) and removes.
Result<nlohmann::json> measure_nvme_rates(const std::string& path, uint64_t bytes) {
  NvmeBenchOptions o;
  std::string tmpl = (std::filesystem::path(path) / "zoe-plan-calibration-XXXXXX").string();
  if (!::mkdtemp(tmpl.data()))
    return Status::Io("cannot make a calibration directory under " + path + ": " + std::strerror(errno));
  o.dir = tmpl;
  o.file_bytes = bytes;
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


int PlanCalibration::ranks() const { return o_.comm ? o_.comm->size() : 1; }

Status PlanCalibration::together() const { return ranks() > 1 ? o_.comm->barrier() : Status::Ok(); }

PlanCalibration::PlanCalibration(const Config& job, PlanCalibrationOptions o) : job_(job), o_(std::move(o)) {
  std::ifstream f(o_.cache_path);
  if (f) cache_ = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!cache_.is_object()) cache_ = nlohmann::json::object();
}

std::string PlanCalibration::machine_key(int ranks, const std::string& device) {
  return fmt::format("{} / {} threads / {}{}{}", cpu_model(), tbb::this_task_arena::max_concurrency(),
                     isa_name(best_isa()), device == "cuda" ? " / " + gpu_model() : "",
                     ranks > 1 ? fmt::format(" / {} ranks", ranks) : "");
}

uint64_t PlanCalibration::model_budget(uint64_t state_bytes) const {
  // The CPU device's arena is a reservation, touched only as used; a GPU's is the job's budget.
  const uint64_t roomy = state_bytes + (uint64_t{64} << 30);
  return on_gpu() ? std::min(roomy, job_.device_memory_budget) : roomy;
}

Result<PlanRates> PlanCalibration::rates() {
  nlohmann::json& m = cache_[machine_key(ranks(), job_.device)];
  const std::string path = job_.offload_optimizer.nvme_path.empty() ? job_.offload_param.nvme_path
                                                                     : job_.offload_optimizer.nvme_path;
  auto say = [&](const char* what, const std::string& text, bool cached) {
    if (o_.human) std::fprintf(o_.human, "  %-18s %s%s\n", what, text.c_str(), cached ? " (cached)" : "");
  };
  const std::string dkey = std::string("adam_") + std::string(dtype_name(job_.dtype));
  bool cached = !o_.recalibrate && m.contains(dkey);
  if (!cached) {
    ZOE_RETURN_IF_ERROR(together());
    m[dkey] = measure_cpu_adam(job_.dtype);
  }
  say("cpu adam", fmt::format("{:.0f} M elements/s", m[dkey].get<double>() / 1e6), cached);
  cached = !o_.recalibrate && m.contains("copy_Bps");
  if (!cached) {
    ZOE_RETURN_IF_ERROR(together());
    m["copy_Bps"] = measure_copy();
  }
  say("host copy", fmt::format("{:.1f} GB/s", m["copy_Bps"].get<double>() / 1e9), cached);
  PlanRates r;
  r.adam_elems_per_s = m[dkey];
  r.host_copy_Bps = m["copy_Bps"];
  if (on_gpu()) {
    cached = !o_.recalibrate && m.contains("gpu") && m["gpu"].contains(dkey);
    if (!cached) {
      ZOE_RETURN_IF_ERROR(together());
      ZOE_ASSIGN_OR_RETURN(nlohmann::json g, measure_gpu(job_));
      m["gpu"][dkey] = g["adam_elems_per_s"];
      for (const char* k : {"h2d_Bps", "d2h_Bps", "d2d_Bps"}) m["gpu"][k] = g[k];
    }
    const nlohmann::json& g = m["gpu"];
    r.compute_on_host_cores = false;
    r.device_adam_elems_per_s = g[dkey];
    r.h2d_Bps = g["h2d_Bps"];
    r.d2h_Bps = g["d2h_Bps"];
    r.device_copy_Bps = g["d2d_Bps"];
    say("gpu", fmt::format("adam {:.0f} M elements/s; host to device {:.1f} GB/s, back {:.1f}, within {:.1f}",
                           r.device_adam_elems_per_s / 1e6, r.h2d_Bps / 1e9, r.d2h_Bps / 1e9, r.device_copy_Bps / 1e9),
        cached);
  }
  if (!path.empty()) {
    const std::string canon = std::filesystem::weakly_canonical(path).string();
    cached = !o_.recalibrate && m["nvme"].contains(canon) && m["nvme"][canon].contains("pass_s_per_elem");
    if (!cached) {
      std::filesystem::create_directories(path);
      ZOE_RETURN_IF_ERROR(together());
      // Plain reads and writes on a file of an eighth of the state, 512 MiB to 1 GiB.
      const uint64_t file = std::clamp<uint64_t>(uint64_t(model_elems()) * 16 / 8 / ranks(),
                                                 uint64_t{512} << 20, uint64_t{1} << 30) >> 20 << 20;
      ZOE_ASSIGN_OR_RETURN(m["nvme"][canon], measure_nvme_rates(path, file));
      m["nvme"][canon]["file_bytes"] = file;
      // The pass itself at both depths (reads and write-backs at once, as a disk moves them more
      // slowly than apart): the faster depth is the plan's.
      // The job's own state up to 128 M elements: a small state moves as fast as its size lets it.
      const int64_t elems = std::clamp<int64_t>(model_elems() / ranks(), 1 << 20, 128 << 20);
      nlohmann::json& n = m["nvme"][canon];
      for (unsigned depth : {8u, 32u}) {
        ZOE_RETURN_IF_ERROR(together());
        ZOE_ASSIGN_OR_RETURN(auto pr, measure_pass(job_, path, depth, elems));
        if (!n.contains("pass_s_per_elem") || pr.first < n["pass_s_per_elem"].get<double>()) {
          n["pass_s_per_elem"] = pr.first;
          n["param_read_Bps"] = pr.second;
          n["queue_depth"] = depth;
        }
      }
    }
    const nlohmann::json& n = m["nvme"][canon];
    say("nvme", fmt::format("read {:.2f} GB/s, write {:.2f} GB/s; the optimizer's pass {:.1f} ns an element, "
                            "parameter reads {:.2f} GB/s, at depth {} ({})", n["read_Bps"].get<double>() / 1e9,
                            n["write_Bps"].get<double>() / 1e9, n["pass_s_per_elem"].get<double>() * 1e9,
                            n["param_read_Bps"].get<double>() / 1e9, n["queue_depth"].get<int>(), canon),
        cached);
    r.nvme_read_Bps = n["read_Bps"];
    r.nvme_write_Bps = n["write_Bps"];
    r.nvme_pass_s_per_elem = n["pass_s_per_elem"];
    r.param_read_Bps = n["param_read_Bps"];
    r.aio_queue_depth = n["queue_depth"];
  }
  const std::string fkey = "fetch_overhead " + model_key(1, false);
  cached = !o_.recalibrate && m.contains(fkey);
  if (!cached) {
    ZOE_RETURN_IF_ERROR(together());
    ZOE_ASSIGN_OR_RETURN(m[fkey], measure_fetch_overhead(on_gpu() ? r.device_copy_Bps : r.host_copy_Bps));
  }
  r.fetch_overhead_s = m[fkey];
  r.fetch_overhead_has_collectives = ranks() > 1;  // measured on the job's communicator
  say("stage-3 fetch", fmt::format("{:.0f} us beside its copy", r.fetch_overhead_s * 1e6), cached);
  if (ranks() > 1) {
    cached = !o_.recalibrate && m.contains("all_gather_Bps");
    if (!cached) {
      ZOE_ASSIGN_OR_RETURN(auto bw, measure_comm(*o_.comm));
      m["all_gather_Bps"] = bw.first;
      m["reduce_scatter_Bps"] = bw.second;
    }
    r.gather_busbw_Bps = m["all_gather_Bps"];
    r.reduce_busbw_Bps = m["reduce_scatter_Bps"];
    say("collectives", fmt::format("all-gather {:.2f} GB/s, reduce-scatter {:.2f} GB/s bus bandwidth, {} ranks",
                                   r.gather_busbw_Bps / 1e9, r.reduce_busbw_Bps / 1e9, ranks()),
        cached);
  }
  return r;
}

// The blocks measured: the whole model where it is small, else two. Two blocks of a small model
// sit in the caches a whole one does not: GPT-2 L6 C384 at micro-batch 1 ran 6.9 ms a block
// whole against 6.0 in two (+16 %; +18 % at 2, within 3 % from 4 on), and the plan's steps at
// 1 x 8 read 1.24x their prediction (bench/history.md, issue 50). A large model's blocks are
// cold either way, and two keep its calibration in seconds.
int64_t PlanCalibration::model_elems() const {
  return o_.model_elems ? o_.model_elems
                        : gpt2::total_numel({job_.n_layer, job_.n_head, job_.n_embd, job_.vocab_size, job_.n_positions});
}

int PlanCalibration::measured_layers() const {
  constexpr int64_t kWholeModelMost = 64'000'000;  // parameters
  return gpt2::total_numel({job_.n_layer, job_.n_head, job_.n_embd, job_.vocab_size, job_.n_positions}) <= kWholeModelMost
             ? job_.n_layer
             : std::min(job_.n_layer, 2);
}

std::string PlanCalibration::model_key(int b, bool ckpt) const {
  const int most = measured_layers();
  return fmt::format("gpt2 C{} H{} V{} T{} {} {} B{}{}{}", job_.n_embd, job_.n_head, job_.vocab_size, job_.seq_len,
                     dtype_name(job_.dtype), resolve_compute_dtype(job_), b, ckpt ? " ckpt" : "",
                     most > 2 ? fmt::format(" L{}", most) : "");
}

// One block and measured_layers() of the job's width, resident on the job's device at stage 0: the
// spans of the larger one's micro-steps give each unit's compute, the device ledger of both the
// model's buffers (fixed, and per block). On a GPU the spans are timed fenced (the device drained
// at each span's ends, so a span holds its kernels, not their launches) and scaled to a micro-step
// run without the fences.
Result<PlanCalibration::UnitTimes> PlanCalibration::measure_model(int b, bool ckpt) {
  UnitTimes t;
  const int most = measured_layers();
  double act_one = 0, act_most = 0;
  for (int layers : most > 1 ? std::vector<int>{1, most} : std::vector<int>{1}) {
    Config c = job_;
    c.n_layer = layers;
    c.stage = 0;
    c.offload_optimizer = c.offload_param = OffloadConfig{};
    if (!on_gpu()) c.device = "cpu";
    c.device_memory_budget =
        model_budget(uint64_t{16} * 2 * gpt2::total_numel({layers, c.n_head, c.n_embd, c.vocab_size, c.n_positions}));
    c.micro_batch = b;
    auto comm = make_self_comm();
    gpt2::Gpt2Shape s{layers, c.n_head, c.n_embd, c.vocab_size, c.n_positions};
    Gpt2Model model(s, ckpt, resolve_compute_dtype(c) == "bf16");
    ZOE_ASSIGN_OR_RETURN(BenchEngine be, make_bench_engine(c, *comm, model));
    ZeroEngine& e = *be.engine;
    Batch batch;
    batch.B = b;
    batch.T = c.seq_len;
    batch.inputs.assign(size_t(b) * c.seq_len, 1);
    batch.targets.assign(size_t(b) * c.seq_len, 2);
    // Warm (buffers, pages), then the device's peak over a micro-step beside the state: the
    // model's buffers and whatever the engine holds for a moment at its hand-overs.
    ZOE_RETURN_IF_ERROR(model.train_micro_step(e, batch, 1.0f).status());
    Ledger& ledger = be.backend.device->ledger();
    ledger.reset_peaks();
    ZOE_RETURN_IF_ERROR(model.train_micro_step(e, batch, 1.0f).status());
    const LedgerSnapshot l = ledger.snapshot();
    (layers == 1 ? act_one : act_most) = double(l.peak[0] - l.persistent(Tier::kDevice));
    if (layers < most) continue;
    // The fastest of at least three timed micro-steps and 0.3 s of them (at most ten).
    Profiler& p = Profiler::get();
    const bool was = p.tracing();
    UnitTimes best;
    double best_total = 1e300, spent = 0;
    const std::function<void()> drain = [&] { (void)be.backend.device->synchronize(); };
    for (int rep = 0; rep < 10 && (rep < 3 || spent < 0.3); ++rep) {
      double wall = 0;
      if (on_gpu()) {
        // Until the GPU is done: the loss is read in the forward, the backward's kernels run after.
        const double t0 = now_s();
        ZOE_RETURN_IF_ERROR(model.train_micro_step(e, batch, 1.0f).status());
        ZOE_RETURN_IF_ERROR(be.backend.device->synchronize());
        wall = now_s() - t0;
        p.set_compute_fence(&drain);
      }
      p.enable_trace(true);
      const double t0 = p.now_us();
      Status st = model.train_micro_step(e, batch, 1.0f).status();
      p.enable_trace(was);
      p.set_compute_fence(nullptr);
      ZOE_RETURN_IF_ERROR(st);
      if (!on_gpu()) wall = (p.now_us() - t0) / 1e6;
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
    if (on_gpu()) {  // the step after it: the GPU's Adam and what each unit's launches add to it
      t.step_s = 1e30;
      for (int rep = 0; rep < 4; ++rep) {
        ZOE_RETURN_IF_ERROR(model.train_micro_step(e, batch, 1.0f).status());
        ZOE_RETURN_IF_ERROR(be.backend.device->synchronize());
        const double t0 = now_s();
        ZOE_RETURN_IF_ERROR(e.step(1e-6).status());
        ZOE_RETURN_IF_ERROR(e.flush().status());
        ZOE_RETURN_IF_ERROR(be.backend.device->synchronize());
        if (rep > 0) t.step_s = std::min(t.step_s, now_s() - t0);
      }
      for (const UnitSpec& u : model.units()) t.step_elems += double(u.numel);
      t.step_units = double(model.units().size());
    }
  }
  t.act_block = most > 1 ? (act_most - act_one) / (most - 1) : 0;
  t.act_fixed = act_one - t.act_block;
  return t;
}

// Two blocks of the job's width at micro-batch 1, resident, at stage 0 and at stage 3 in turns:
// what a stage-3 micro-step takes beyond the other, less its chunks' copies, per fetch.
Result<double> PlanCalibration::measure_fetch_overhead(double copy_Bps) {
  int fetches = 0;
  int64_t copied = 0;
  const int layers = std::min(job_.n_layer, 2);
  gpt2::Gpt2Shape s{layers, job_.n_head, job_.n_embd, job_.vocab_size, job_.n_positions};
  Gpt2Model model(s, false, resolve_compute_dtype(job_) == "bf16");
  for (const UnitSpec& u : model.units()) copied += u.numel;
  fetches = 2 * layers + 5;  // GPT-2's fetches at a micro-step (plan_calibration's order)
  // On more ranks the engines run on the job's communicator (every rank at once): a stage-3
  // fetch's agreement and all-gather are what it costs there.
  struct Case {
    std::unique_ptr<Comm> own;
    Comm* comm = nullptr;
    BenchEngine be;
  };
  Case cases[2];
  for (int i = 0; i < 2; ++i) {
    Config c = job_;
    c.n_layer = layers;
    c.stage = i == 0 ? 0 : 3;
    c.offload_optimizer = c.offload_param = OffloadConfig{};
    if (!on_gpu()) c.device = "cpu";
    c.device_memory_budget = model_budget(uint64_t{16} * 2 * gpt2::total_numel(s));
    c.micro_batch = 1;
    if (ranks() > 1) {
      cases[i].comm = o_.comm;
    } else {
      cases[i].own = make_self_comm();
      cases[i].comm = cases[i].own.get();
    }
    ZOE_ASSIGN_OR_RETURN(cases[i].be, make_bench_engine(c, *cases[i].comm, model));
  }
  Batch batch;
  batch.B = 1;
  batch.T = job_.seq_len;
  batch.inputs.assign(job_.seq_len, 1);
  batch.targets.assign(job_.seq_len, 2);
  Gpt2Model models[2] = {Gpt2Model(s, false, resolve_compute_dtype(job_) == "bf16"),
                         Gpt2Model(s, false, resolve_compute_dtype(job_) == "bf16")};
  // Paired: each rep's stage-3 micro-step against the stage-0 one just before it; the median.
  // A step between micro-steps, as in training: stage 3 then follows the recorded order and
  // loads ahead, so what is left is the bookkeeping and the copies the model adds itself.
  std::vector<double> extra;
  for (int rep = 0; rep < 10; ++rep) {
    double t[2];
    for (int i = 0; i < 2; ++i) {
      const double t0 = now_s();
      ZOE_RETURN_IF_ERROR(models[i].train_micro_step(*cases[i].be.engine, batch, 1.0f).status());
      t[i] = now_s() - t0;
      ZOE_RETURN_IF_ERROR(cases[i].be.engine->step(0.0).status());
      ZOE_RETURN_IF_ERROR(cases[i].be.engine->flush().status());
    }
    if (rep > 1) extra.push_back(t[1] - t[0]);
  }
  std::nth_element(extra.begin(), extra.begin() + extra.size() / 2, extra.end());
  // Less what the step model adds itself: each unit's copy (its chunk: 1/N of it) twice.
  const double copies = double(copied) / ranks() * dtype_size(job_.dtype) * 2 / copy_Bps;
  return std::max(0.0, (extra[extra.size() / 2] - copies) / fetches);
}

Result<MicroStepWork> PlanCalibration::micro_step(int b, bool ckpt) {
  nlohmann::json& models = cache_[machine_key(ranks(), job_.device)]["models"];
  const std::string key = model_key(b, ckpt);
  const bool cached = !o_.recalibrate && models.contains(key);
  if (!cached) {
    ZOE_RETURN_IF_ERROR(together());
    Result<UnitTimes> m = measure_model(b, ckpt);
    // A micro-batch the device has no room for (a GPU's budget): remembered, and refused.
    const bool no_room = m.status().code() == Code::kOutOfMemory || Gpt2Model::activations_do_not_fit(m.status());
    if (no_room) models[key] = {{"out_of_memory", m.status().message()}};
    else ZOE_RETURN_IF_ERROR(m.status());
    if (m.ok()) {
      const UnitTimes& u = *m;
      models[key] = {{"encoder_f", u.encoder_f}, {"block_f", u.block_f}, {"head_f", u.head_f},
                     {"encoder_b", u.encoder_b}, {"block_b", u.block_b}, {"head_b", u.head_b},
                     {"act_fixed", u.act_fixed}, {"act_block", u.act_block}};
      if (u.step_units > 0)
        models[key].update({{"step_s", u.step_s}, {"step_elems", u.step_elems}, {"step_units", u.step_units}});
    }
  }
  const nlohmann::json& u = models[key];
  if (u.contains("out_of_memory")) {
    if (o_.human)
      std::fprintf(o_.human, "  %-18s B=%d%s: out of device memory%s\n", "micro-step", b, ckpt ? " checkpointed" : "",
                   cached ? " (cached)" : "");
    return Status::OutOfMemory(u["out_of_memory"].get<std::string>());
  }
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
  // A GPU's step beyond its Adam, a unit (rates() measured the Adam first).
  const nlohmann::json& machine = cache_[machine_key(ranks(), job_.device)];
  const std::string dkey = std::string("adam_") + std::string(dtype_name(job_.dtype));
  if (auto gpu = machine.find("gpu"); u.contains("step_s") && gpu != machine.end() && gpu->contains(dkey)) {
    const double adam = u["step_elems"].get<double>() / (*gpu)[dkey].get<double>();
    w.step_overhead_per_unit_s = std::max(0.0, (u["step_s"].get<double>() - adam) / u["step_units"].get<double>());
  }
  if (o_.human && !cached) {
    double f = 0, bw = 0;
    for (const PlanFetch& x : w.fetches) (x.backward ? bw : f) += x.compute_s;
    std::fprintf(o_.human, "  %-18s B=%d%s: forward %.3f s, backward %.3f s, activations %.2f GB (measured)\n",
                 "micro-step", b, ckpt ? " checkpointed" : "", f, bw, w.activation_bytes / 1e9);
  }
  return w;
}

Status PlanCalibration::save() const {
  if (o_.comm && o_.comm->rank() != 0) return Status::Ok();
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

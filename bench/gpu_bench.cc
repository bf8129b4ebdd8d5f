#include "gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tbb/global_control.h>

#include "kernels/adam.h"
#include "bench_process.h"
#include "plan_calibration.h"
#include "step_bench.h"
#ifdef ZOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_device.h"
#include "ops/model_ops.h"
#endif

namespace zoe {

double pcie_rated_gbps(const std::string& link_speed, const std::string& link_width) {
  char* end = nullptr;
  const double gts = std::strtod(link_speed.c_str(), &end);
  if (end == link_speed.c_str() || link_speed.find("GT/s") == std::string::npos || gts <= 0) return 0;
  const long lanes = std::strtol(link_width.c_str(), &end, 10);
  if (end == link_width.c_str() || lanes <= 0) return 0;
  const double encoding = gts >= 8.0 ? 128.0 / 130.0 : 8.0 / 10.0;
  return gts * static_cast<double>(lanes) * encoding / 8.0;
}

// Dense bf16 tensor-core TFLOP/s (no sparsity) from NVIDIA's data sheets, by the name the driver
// reports ("NVIDIA H200"); 0 where the GPU is not listed. Longer names first.
double rated_bf16_tflops(const std::string& name) {
  static const std::pair<const char*, double> kRated[] = {
      {"H200 NVL", 835.5}, {"H200", 989.4}, {"H100 NVL", 835.5}, {"H100 PCIe", 756.5},
      {"H100", 989.4},     {"A100", 312.0}, {"L40S", 362.1},
  };
  for (const auto& [key, tflops] : kRated)
    if (name.find(key) != std::string::npos) return tflops;
  return 0;
}

#ifndef ZOE_HAVE_CUDA
Status bench_gpu(const GpuBenchOptions&, nlohmann::json*, std::FILE*) {
  return Status::Unsupported("bench gpu: this zoe was built without CUDA (reconfigure with -DZOE_CUDA=ON)");
}
#else
namespace {

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Runtime(fmt::format("bench gpu: {}: {}", what, cudaGetErrorString(e)));
}

// A result row. Each is said on stderr as it is made, too: a run cut at its time limit (a GPU
// lease's one call) keeps in its log the rows it had, where the table and the JSON come at the end.
nlohmann::json row(const std::string& name, double measured, double baseline, const std::string& unit,
                   const std::string& against) {
  std::fprintf(stderr, "zoe bench gpu: %s: %.4g against %.4g %s (%.3f)\n", name.c_str(), measured, baseline,
               unit.c_str(), measured / baseline);
  return {{"case", name}, {"measured", measured}, {"baseline", baseline}, {"ratio", measured / baseline},
          {"unit", unit}, {"baseline_is", against}};
}

// The rated rate of the PCIe link of GPU `gpu`, from sysfs (0 where the link is not visible, as in
// some VMs).
double link_rated_gbps(int gpu) {
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, gpu) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  std::string id(bus);
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  auto read = [&](const char* file) {
    std::ifstream f("/sys/bus/pci/devices/" + id + "/" + file);
    std::string line;
    std::getline(f, line);
    return line;
  };
  return pcie_rated_gbps(read("current_link_speed"), read("current_link_width"));
}

// h2d and d2h: the engine's copy path against the link's rated rate, and against cudaMemcpyAsync
// between the same buffers (the path's own cost).
Status bench_copies(CudaDevice& dev, const GpuBenchOptions& o, nlohmann::json& results) {
  const double link = link_rated_gbps(dev.gpu());
  ZOE_ASSIGN_OR_RETURN(Buffer host, dev.alloc(o.copy_bytes, Tier::kHost, Kind::kStaging));
  ZOE_ASSIGN_OR_RETURN(Buffer d, dev.alloc(o.copy_bytes, Tier::kDevice, Kind::kStaging));
  Status st = Status::Ok();
  for (bool h2d : {true, false}) {
    Stream s = h2d ? Stream::kH2D : Stream::kD2H;
    const Buffer &dst = h2d ? d : host, &src = h2d ? host : d;
    auto zoe_copy = [&]() -> Status {
      ZOE_RETURN_IF_ERROR(dev.copy_async(dst, 0, src, 0, o.copy_bytes, s));
      return dev.wait(dev.record(s));
    };
    auto raw_copy = [&]() -> Status {
      ZOE_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(dst.data, src.data, o.copy_bytes,
                                                  h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                                  dev.stream(s)), "cudaMemcpyAsync"));
      return cuda_ok(cudaStreamSynchronize(dev.stream(s)), "cudaStreamSynchronize");
    };
    auto z = best_seconds(o.iters, zoe_copy);
    auto r = best_seconds(o.iters, raw_copy);
    if (!z.ok() || !r.ok()) {
      st = z.ok() ? r.status() : z.status();
      break;
    }
    const double zoe_gbps = o.copy_bytes / *z / 1e9;
    // Where sysfs does not show the link (some VMs), only the path's rows are printed.
    if (link > 0)
      results.push_back(row(h2d ? "h2d" : "d2h", zoe_gbps, link, "GB/s", "the PCIe link's rated rate"));
    results.push_back(row(h2d ? "h2d_path" : "d2h_path", zoe_gbps, o.copy_bytes / *r / 1e9, "GB/s",
                          "a bare cudaMemcpyAsync, same buffers"));
  }
  dev.free(host);
  dev.free(d);
  return st;
}

// Adam over bf16 gradients into fp32 state and a bf16 weight copy: 2 + 3 x 4 read, 3 x 4 + 2
// written = 28 bytes per element; the baseline copies 14 bytes per element device to device
// (14 read + 14 written).
Status bench_adam_gpu(CudaDevice& dev, const GpuBenchOptions& o, nlohmann::json& results) {
  const size_t n = o.adam_elems;
  ZOE_ASSIGN_OR_RETURN(Buffer state, dev.alloc(n * 16, Tier::kDevice, Kind::kStaging));  // grad, m/v/master, param
  ZOE_ASSIGN_OR_RETURN(Buffer copy, dev.alloc(n * 14, Tier::kDevice, Kind::kStaging));
  ZOE_ASSIGN_OR_RETURN(Buffer counter, dev.alloc(8, Tier::kDevice, Kind::kStaging));
  Status st = dev.zero(state.data, n * 16);
  if (st.ok()) st = dev.zero(counter.data, 8);
  char* base = state.as<char>();
  AdamRange r;
  r.grad = base;
  r.grad_dtype = DType::kBF16;
  r.master = reinterpret_cast<float*>(base + 2 * n);
  r.exp_avg = reinterpret_cast<float*>(base + 6 * n);
  r.exp_avg_sq = reinterpret_cast<float*>(base + 10 * n);
  r.param_out = base + 14 * n;
  r.param_dtype = DType::kBF16;
  r.n = n;
  AdamHyper h;
  h.weight_decay = 0.1;
  auto adam = [&]() -> Status {
    ZOE_RETURN_IF_ERROR(dev.adam(h, &r, 1, counter.as<uint64_t>()));
    return dev.synchronize();
  };
  auto d2d = [&]() -> Status {
    ZOE_RETURN_IF_ERROR(dev.copy(copy.data, state.data, n * 14, Stream::kCompute));
    return dev.synchronize();
  };
  if (st.ok()) {
    auto a = best_seconds(o.iters, adam);
    auto c = best_seconds(o.iters, d2d);
    if (a.ok() && c.ok())
      results.push_back(row("adam bf16 grad, bf16 weights", 28.0 * n / *a / 1e9, 28.0 * n / *c / 1e9, "GB/s",
                            "device-to-device copy of the same bytes"));
    else
      st = a.ok() ? c.status() : a.status();
  }
  for (Buffer* b : {&state, &copy, &counter}) dev.free(*b);
  return st;
}

// The bf16 product as cuBLASLt runs it here: 8192^3 through the model ops (bf16 in and out, fp32
// accumulation), TFLOP/s against the data sheet's dense bf16 rate (the measured rate stands in
// where the GPU is not listed). *tflops: the measured rate.
Status bench_bf16_gemm(CudaDevice& dev, const GpuBenchOptions& o, nlohmann::json& results, double* tflops,
                       double* rated) {
  const int kN = o.smoke ? 256 : 8192;
  const size_t elems = static_cast<size_t>(kN) * kN;
  ZOE_ASSIGN_OR_RETURN(Buffer buf, dev.alloc(3 * elems * 2, Tier::kDevice, Kind::kStaging));
  auto* a = buf.as<uint16_t>();
  Status st = dev.zero(buf.data, 3 * elems * 2);
  auto gemm = [&]() -> Status {
    dev.ops().matmul_forward_bf16(a + 2 * elems, a, a + elems, nullptr, kN, kN, kN);
    ZOE_RETURN_IF_ERROR(dev.ops().status());
    return dev.synchronize();
  };
  if (st.ok()) {
    Result<double> s = best_seconds(o.iters, gemm);
    if (s.ok()) {
      cudaDeviceProp p{};
      std::string name = cudaGetDeviceProperties(&p, dev.gpu()) == cudaSuccess ? p.name : "";
      *tflops = 2.0 * kN * double(kN) * kN / *s / 1e12;
      *rated = rated_bf16_tflops(name);
      results.push_back(row(fmt::format("bf16 GEMM {}^3 TFLOP/s", kN), *tflops, *rated > 0 ? *rated : *tflops, "TFLOP/s",
                            *rated > 0 ? "the data sheet's dense bf16 rate of " + name
                                       : name + ": no data sheet rate listed, the measured rate itself"));
    } else {
      st = s.status();
    }
  }
  dev.free(buf);
  return st;
}

// GPT-2's LM head as the bf16 step runs it (B8 T1024: N 8192, C 768), forward and backward, at
// its vocabulary (50257: the logits' rows start 2 bytes apart, which keeps cuBLASLt off its
// aligned kernels) against the same at 50304 (llm.c's padded vocabulary, a multiple of 64): what
// padding the vocabulary would buy. TFLOP/s of the three products.
Status bench_lm_head(CudaDevice& dev, const GpuBenchOptions& o, nlohmann::json& results) {
  const int N = o.smoke ? 64 : 8192, C = o.smoke ? 64 : 768;
  const int vocab = o.smoke ? 257 : 50257, padded = o.smoke ? 320 : 50304;
  const size_t most = static_cast<size_t>(N) * padded;
  // bf16 logits and inp, wte; fp32 dinp and dwte
  const size_t bytes = 2 * (most + size_t(N) * C + size_t(padded) * C) + 4 * (size_t(N) * C + size_t(padded) * C);
  ZOE_ASSIGN_OR_RETURN(Buffer buf, dev.alloc(bytes, Tier::kDevice, Kind::kStaging));
  auto* logits = buf.as<uint16_t>();
  auto* inp = logits + most;
  auto* wte = inp + size_t(N) * C;
  auto* dinp = reinterpret_cast<float*>(wte + size_t(padded) * C);
  auto* dwte = dinp + size_t(N) * C;
  Status st = dev.zero(buf.data, bytes);
  double rate[2] = {0, 0};
  for (int i = 0; i < 2 && st.ok(); ++i) {
    const int V = i == 0 ? vocab : padded;
    auto head = [&]() -> Status {
      dev.ops().lm_head_forward_bf16(logits, inp, wte, N, C, V);
      dev.ops().lm_head_backward_bf16(dinp, dwte, logits, inp, wte, N, C, V);
      ZOE_RETURN_IF_ERROR(dev.ops().status());
      return dev.synchronize();
    };
    Result<double> s = best_seconds(o.iters, head);
    if (!s.ok()) st = s.status();
    else rate[i] = 3 * 2.0 * N * double(C) * V / *s / 1e12;
  }
  if (st.ok())
    results.push_back(row(fmt::format("bf16 LM head fwd+bwd, V {} TFLOP/s", vocab), rate[0], rate[1], "TFLOP/s",
                          fmt::format("the same products at V {} (a padded vocabulary)", padded)));
  dev.free(buf);
  return st;
}

// GPT-2's training FLOPs a token: 6 per parameter a token meets in a product (the blocks and the
// tied LM head; not the position table, a lookup) and the causal attention's two T x T products,
// 6 T C a layer (PaLM's count, halved for the causal mask).
double gpt2_flops_per_token(const gpt2::Gpt2Shape& s, int T) {
  const double C = s.n_embd, L = s.n_layer;
  const double block = 12 * C * C + 13 * C;  // qkv, proj, fc, fc_proj weights and biases, 2 LayerNorms
  const double params = L * block + double(s.vocab_size) * C + 2 * C;
  return 6 * params + 6 * L * T * C;
}

// One GPT-2 row: zoe with `o` against PyTorch in `torch_mode`. These rows were written before a
// GPU ran them: a failure is reported beside the table and the rows after it still run. The
// timing's zoe run (0 step_s on failure).
StepTiming peer_row(const StepBenchOptions& o, const std::string& py, const char* torch_mode, const char* what,
                    const char* baseline_is, nlohmann::json& results) {
  const double tokens = double(o.B) * o.T;
  Result<StepTiming> z = time_zoe_step(o, 1);
  Result<nlohmann::json> t = z.ok() ? time_torch_step(o, py, 1, torch_mode) : Result<nlohmann::json>(z.status());
  if (t.ok() && t->contains("unsupported")) t = Status::Unsupported((*t)["unsupported"].get<std::string>());
  if (t.ok())
    results.push_back(row(fmt::format("gpt2 124M B8 T1024 {} tokens/s", what), tokens / z->step_s,
                          tokens / (*t)["step_s"].get<double>(), "tokens/s", baseline_is));
  else
    std::fprintf(stderr, "zoe bench gpu: the %s GPT-2 row failed: %s\n", what, t.status().message().c_str());
  return z.ok() ? *z : StepTiming{};
}

// Where the bf16 step's GPU time goes: each model op timed by events around it (a run of its own:
// the events cost host time the compared runs do not pay), grouped; `split` gets ms per step.
Status bf16_split(const StepBenchOptions& s, nlohmann::json& split, std::FILE* human) {
  StepBenchOptions o = s;
  o.op_times = true;
  o.warmup = 1;
  o.iters = 3;
  ZOE_ASSIGN_OR_RETURN(StepTiming t, time_zoe_step(o, 1));
  double products = 0, attention_forward = 0, attention_backward = 0, other = 0;
  for (const auto& [op, sec] : t.op_s) {
    if (op.starts_with("matmul") || op.starts_with("lm_head")) products += sec;
    else if (op.starts_with("attention_forward")) attention_forward += sec;
    else if (op.starts_with("attention_backward")) attention_backward += sec;
    else other += sec;
    split["ops_ms"][op] = sec * 1e3;
  }
  split["step_ms"] = t.step_s * 1e3;
  split["products_ms"] = products * 1e3;
  split["attention_forward_ms"] = attention_forward * 1e3;
  split["attention_backward_ms"] = attention_backward * 1e3;
  split["elementwise_ms"] = other * 1e3;
  split["optimizer_ms"] = t.optimizer * 1e3;  // the step's optimizer span, host clock
  split["attention_share"] = (attention_forward + attention_backward) / t.step_s;
  if (human)
    std::fprintf(human,
                 "bf16 step %.1f ms (op timing on): products %.1f, attention %.1f + %.1f (%.0f %% of the step), "
                 "other ops %.1f, optimizer %.1f\n",
                 t.step_s * 1e3, products * 1e3, attention_forward * 1e3, attention_backward * 1e3,
                 100 * (attention_forward + attention_backward) / t.step_s, other * 1e3, t.optimizer * 1e3);
  return Status::Ok();
}

// The measured rate (bytes a second) of one of bench_copies' rows; 0 where it is absent.
double copy_rate(const nlohmann::json& results, const char* name) {
  for (const auto& r : results)
    if (r["case"] == name) return r["measured"].get<double>() * 1e9;
  return 0;
}

// What the offloaded step cannot beat, each part measured in this run: the GPU's compute (the
// resident step less its optimizer), the link (the step's host <-> device bytes at the copies'
// measured rates, the two directions at once), the disk (its NVMe bytes at the store's rates
// there, reads and writes in turn) and the CPU Adam (every parameter, on the step's threads).
// The bound is the slowest of them: the step at 1.0 would hide all the others behind it.
Result<nlohmann::json> offload_bound(const GpuBenchOptions& o, const StepTiming& resident, const StepTiming& off,
                                     const nlohmann::json& results, int threads) {
  const double h2d = copy_rate(results, "h2d_path"), d2h = copy_rate(results, "d2h_path");
  std::error_code ec;
  std::filesystem::create_directories(o.nvme_dir, ec);
  ZOE_ASSIGN_OR_RETURN(nlohmann::json disk,
                       measure_nvme_rates(o.nvme_dir, o.smoke ? uint64_t{16} << 20 : uint64_t{512} << 20));
  double adam = 0;
  {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    adam = measure_cpu_adam(DType::kF32);
  }
  const nlohmann::json parts = {
      {"compute_s", resident.step_s - resident.optimizer},
      {"link_s", std::max(h2d > 0 ? off.h2d_bytes / h2d : 0.0, d2h > 0 ? off.d2h_bytes / d2h : 0.0)},
      {"disk_s", off.nvme_read_bytes / disk["read_Bps"].get<double>() +
                     off.nvme_written_bytes / disk["write_Bps"].get<double>()},
      {"cpu_adam_s", double(off.params) / adam},
      {"h2d_bytes", off.h2d_bytes}, {"d2h_bytes", off.d2h_bytes}, {"h2d_Bps", h2d}, {"d2h_Bps", d2h},
      {"nvme_read_bytes", off.nvme_read_bytes}, {"nvme_written_bytes", off.nvme_written_bytes},
      {"nvme_read_Bps", disk["read_Bps"]}, {"nvme_write_Bps", disk["write_Bps"]},
      {"cpu_adam_elems_per_s", adam}, {"threads", threads}};
  std::string slowest;
  double bound = 0;
  for (const char* part : {"compute_s", "link_s", "disk_s", "cpu_adam_s"})
    if (parts[part].get<double>() > bound) bound = parts[part].get<double>(), slowest = part;
  nlohmann::json r = row("gpt2 124M offloaded step vs bound s", off.step_s, bound, "s",
                         fmt::format("max(GPU compute {:.3f}, link {:.3f}, disk {:.3f}, CPU Adam {:.3f}): {}",
                                     parts["compute_s"].get<double>(), parts["link_s"].get<double>(),
                                     parts["disk_s"].get<double>(), parts["cpu_adam_s"].get<double>(),
                                     slowest.substr(0, slowest.size() - 2)));
  r["parts"] = parts;
  return r;
}

// GPT-2 124M at B 8, T 1024 in fp32: zoe resident against PyTorch, then zoe offloaded.
Status bench_gpt2_gpu(const GpuBenchOptions& o, double bf16_peak, nlohmann::json& results, nlohmann::json& split,
                      std::FILE* human) {
  StepBenchOptions s;
  s.shape = {/*n_layer=*/12, /*n_head=*/12, /*n_embd=*/768, /*vocab_size=*/50257, /*n_positions=*/1024};
  s.B = 8;
  s.T = 1024;
  s.device = "cuda";
  s.device_budget = uint64_t{100} << 30;
  s.warmup = 2;
  s.iters = 5;
  if (o.smoke) {  // every row, on a model the emulated GPU runs in seconds
    s.shape = {/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/64, /*vocab_size=*/512, /*n_positions=*/64};
    s.B = 2;
    s.T = 64;
    s.warmup = 1;
    s.iters = 1;
  }
  s.python = o.python;
  s.op_times = false;
  const double tokens = double(s.B) * s.T;
  ZOE_ASSIGN_OR_RETURN(StepTiming resident, time_zoe_step(s, 1));
  if (o.torch) {
    ZOE_ASSIGN_OR_RETURN(std::string py, find_torch_python(s));
    ZOE_ASSIGN_OR_RETURN(nlohmann::json t, time_torch_step(s, py, 1));
    results.push_back(row("gpt2 124M B8 T1024 fp32 tokens/s", tokens / resident.step_s,
                          tokens / t["step_s"].get<double>(), "tokens/s", "PyTorch on the same GPU"));
    // fp32 training with TF32 products on both sides (zoe.allow_tf32; PyTorch's allow_tf32).
    StepBenchOptions t32 = s;
    t32.allow_tf32 = true;
    peer_row(t32, py, "eager_tf32", "tf32", "PyTorch eager with allow_tf32", results);
  }
  // bf16 training as each does it on a GPU: zoe's bf16 compute (bf16 weights, cuBLASLt bf16
  // products, fp32 master and Adam) against PyTorch's autocast to bf16.
  StepBenchOptions b = s;
  b.bf16 = true;
  StepTiming bf16;
  if (o.torch) {
    ZOE_ASSIGN_OR_RETURN(std::string py, find_torch_python(s));
    bf16 = peer_row(b, py, "autocast_bf16", "bf16", "PyTorch autocast bf16 on the same GPU", results);
    if (o.torch_compile)
      peer_row(b, py, "compile_autocast_bf16", "bf16 (vs compile)", "PyTorch torch.compile + autocast bf16", results);
  } else {
    ZOE_ASSIGN_OR_RETURN(bf16, time_zoe_step(b, 1));
  }
  // The attention's library against zoe's own kernels: the same step with ZOE_CUDA_ATTENTION=mma
  // (the default takes cuDNN's fused attention where the build and GPU have it).
  if (bf16.step_s > 0) {
    const char* before = std::getenv("ZOE_CUDA_ATTENTION");
    const std::string saved = before ? before : "";
    setenv("ZOE_CUDA_ATTENTION", "mma", 1);
    Result<StepTiming> own = time_zoe_step(b, 1);
    if (before) setenv("ZOE_CUDA_ATTENTION", saved.c_str(), 1);
    else unsetenv("ZOE_CUDA_ATTENTION");
    if (own.ok())
      results.push_back(row("gpt2 bf16 tokens/s, attention default vs mma", tokens / bf16.step_s,
                            tokens / own->step_s, "tokens/s",
                            "the same step on zoe's own attention kernels (ZOE_CUDA_ATTENTION=mma)"));
    else
      std::fprintf(stderr, "zoe bench gpu: the bf16 step on zoe's attention kernels failed: %s\n",
                   own.status().message().c_str());
  }
  // Model FLOP/s of the bf16 step against the GPU's dense bf16 rate (bench_bf16_gemm's baseline).
  if (bf16.step_s > 0 && bf16_peak > 0)
    results.push_back(row("gpt2 bf16 model TFLOP/s", gpt2_flops_per_token(s.shape, s.T) * tokens / bf16.step_s / 1e12,
                          bf16_peak, "TFLOP/s", "the GPU's dense bf16 rate (the GEMM row's baseline)"));
  if (Status st = bf16_split(b, split, human); !st.ok())
    std::fprintf(stderr, "zoe bench gpu: the bf16 step's split failed: %s\n", st.message().c_str());
  // The offloaded step: what the resident run held as persistent state shrinks to a quarter; its
  // transient bytes (activations, staging) stay, plus stage 3's gather and reduction buffers of
  // the largest unit (the embedding, fp32).
  StepBenchOptions off = s;
  off.stage = 3;
  off.nvme_dir = o.nvme_dir;
  uint64_t transient = resident.peak_device_bytes - resident.persistent_device_bytes;
  uint64_t largest_unit = uint64_t(s.shape.vocab_size + s.shape.n_positions) * s.shape.n_embd * 4;
  off.device_budget = transient + resident.persistent_device_bytes / 4 + 2 * largest_unit;
  // On every core, as its users run it: the CPU Adam and the NVMe threads share them.
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ZOE_ASSIGN_OR_RETURN(StepTiming offloaded, time_zoe_step(off, threads));
  nlohmann::json r = row("gpt2 124M offloaded step s", offloaded.step_s, resident.step_s, "s",
                         "the same step fully resident (stage 0)");
  r["device_budget"] = off.device_budget;
  results.push_back(r);
  ZOE_ASSIGN_OR_RETURN(nlohmann::json bound, offload_bound(o, resident, offloaded, results, threads));
  results.push_back(bound);
  return Status::Ok();
}

void print_table(std::FILE* human, const nlohmann::json& results) {
  std::fprintf(human, "%-36s %14s %14s %8s  %s\n", "case", "zoe", "baseline", "ratio", "baseline is");
  for (const auto& r : results)
    std::fprintf(human, "%-36s %14.3f %14.3f %8.3f  %s (%s)\n", r["case"].get<std::string>().c_str(),
                 r["measured"].get<double>(), r["baseline"].get<double>(), r["ratio"].get<double>(),
                 r["baseline_is"].get<std::string>().c_str(), r["unit"].get<std::string>().c_str());
}

}  // namespace

Status bench_gpu(const GpuBenchOptions& options, nlohmann::json* out, std::FILE* human) {
  GpuBenchOptions o = options;
  if (o.smoke) {
    o.copy_bytes = size_t{1} << 20;
    o.adam_elems = size_t{1} << 16;
    o.iters = 1;
    o.torch = false;
  }
  ZOE_ASSIGN_OR_RETURN(auto device, make_cuda_device(local_gpu_index(), uint64_t{120} << 30, uint64_t{16} << 30));
  auto& dev = static_cast<CudaDevice&>(*device);
  nlohmann::json results = nlohmann::json::array();
  ZOE_RETURN_IF_ERROR(bench_copies(dev, o, results));
  ZOE_RETURN_IF_ERROR(bench_adam_gpu(dev, o, results));
  double gemm_tflops = 0, rated_tflops = 0;
  ZOE_RETURN_IF_ERROR(bench_bf16_gemm(dev, o, results, &gemm_tflops, &rated_tflops));
  ZOE_RETURN_IF_ERROR(bench_lm_head(dev, o, results));
  device.reset();  // the GPT-2 runs bring their own device
  nlohmann::json split = nlohmann::json::object();
  ZOE_RETURN_IF_ERROR(bench_gpt2_gpu(o, rated_tflops > 0 ? rated_tflops : gemm_tflops, results, split, human));
  if (human) print_table(human, results);
  if (out) *out = {{"bench", "gpu"}, {"results", results}, {"bf16_split", split}};
  return Status::Ok();
}
#endif

}  // namespace zoe

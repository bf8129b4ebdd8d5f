#include "gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/adam.h"
#include "step_bench.h"
#ifdef ZOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_device.h"
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

// The best of `iters` timings of fn (each ends with the GPU idle).
Result<double> best_seconds(int iters, const std::function<Status()>& fn) {
  ZOE_RETURN_IF_ERROR(fn());  // warm-up
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ZOE_RETURN_IF_ERROR(fn());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

nlohmann::json row(const std::string& name, double measured, double baseline, const std::string& unit,
                   const std::string& against) {
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

// One GPT-2 row: zoe with `o` against PyTorch in `torch_mode`. These rows were written before a
// GPU ran them: a failure is reported beside the table and the rows after it still run.
void peer_row(const StepBenchOptions& o, const std::string& py, const char* torch_mode, const char* what,
              const char* baseline_is, nlohmann::json& results) {
  const double tokens = double(o.B) * o.T;
  Result<StepTiming> z = time_zoe_step(o, 1);
  Result<nlohmann::json> t = z.ok() ? time_torch_step(o, py, 1, torch_mode) : Result<nlohmann::json>(z.status());
  if (t.ok())
    results.push_back(row(fmt::format("gpt2 124M B8 T1024 {} tokens/s", what), tokens / z->step_s,
                          tokens / (*t)["step_s"].get<double>(), "tokens/s", baseline_is));
  else
    std::fprintf(stderr, "zoe bench gpu: the %s GPT-2 row failed: %s\n", what, t.status().message().c_str());
}

// GPT-2 124M at B 8, T 1024 in fp32: zoe resident against PyTorch, then zoe offloaded.
Status bench_gpt2_gpu(const GpuBenchOptions& o, nlohmann::json& results) {
  StepBenchOptions s;
  s.shape = {/*n_layer=*/12, /*n_head=*/12, /*n_embd=*/768, /*vocab_size=*/50257, /*n_positions=*/1024};
  s.B = 8;
  s.T = 1024;
  s.device = "cuda";
  s.device_budget = uint64_t{100} << 30;
  s.warmup = 2;
  s.iters = 5;
  s.python = o.python;
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
    // bf16 training as each does it on a GPU: zoe's bf16 compute (bf16 weights, cuBLASLt bf16
    // products, fp32 master and Adam) against PyTorch's autocast to bf16.
    StepBenchOptions b = s;
    b.bf16 = true;
    peer_row(b, py, "autocast_bf16", "bf16", "PyTorch autocast bf16 on the same GPU", results);
  }
  // The offloaded step: what the resident run held as persistent state shrinks to a quarter; its
  // transient bytes (activations, staging) stay, plus stage 3's gather and reduction buffers of
  // the largest unit (the embedding, fp32).
  StepBenchOptions off = s;
  off.stage = 3;
  off.nvme_dir = o.nvme_dir;
  uint64_t transient = resident.peak_device_bytes - resident.persistent_device_bytes;
  uint64_t largest_unit = uint64_t(s.shape.vocab_size + s.shape.n_positions) * s.shape.n_embd * 4;
  off.device_budget = transient + resident.persistent_device_bytes / 4 + 2 * largest_unit;
  ZOE_ASSIGN_OR_RETURN(StepTiming offloaded, time_zoe_step(off, 1));
  nlohmann::json r = row("gpt2 124M offloaded step s", offloaded.step_s, resident.step_s, "s",
                         "the same step fully resident (stage 0)");
  r["device_budget"] = off.device_budget;
  results.push_back(r);
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

Status bench_gpu(const GpuBenchOptions& o, nlohmann::json* out, std::FILE* human) {
  ZOE_ASSIGN_OR_RETURN(auto device, make_cuda_device(local_gpu_index(), uint64_t{120} << 30, uint64_t{16} << 30));
  auto& dev = static_cast<CudaDevice&>(*device);
  nlohmann::json results = nlohmann::json::array();
  ZOE_RETURN_IF_ERROR(bench_copies(dev, o, results));
  ZOE_RETURN_IF_ERROR(bench_adam_gpu(dev, o, results));
  device.reset();  // the GPT-2 runs bring their own device
  ZOE_RETURN_IF_ERROR(bench_gpt2_gpu(o, results));
  if (human) print_table(human, results);
  if (out) *out = {{"bench", "gpu"}, {"results", results}};
  return Status::Ok();
}
#endif

}  // namespace zoe

// `zoe bench gpu`: the GPU path against its own ceilings, in one run on one GPU:
//   h2d, d2h   the engine's copies (Device::copy_async from pinned memory) vs the PCIe link's
//              rated rate (its generation and width, from sysfs: pcie_rated_gbps); and
//              h2d_path, d2h_path: the same copies vs a bare cudaMemcpyAsync between the same
//              buffers (what the engine's path costs over the runtime call, 1.00 = nothing);
//   adam       CudaDevice::adam's bytes moved per second vs a device-to-device copy of the same
//              bytes (every byte Adam reads or writes, read and written once);
//   gemm       a bf16 8192^3 product through the model ops (cuBLASLt) vs the data sheet's dense
//              bf16 rate (rated_bf16_tflops; the measured rate where the GPU is not listed);
//   gpt2       zoe's GPT-2 tokens/s (resident, stage 0) vs PyTorch training the same model on the
//              same GPU (bench/torch_gpt2_step.py --device cuda), in fp32, TF32 and bf16 (zoe's
//              bf16 compute against PyTorch's autocast; with torch_compile also against
//              torch.compile + autocast), the bf16 step's model TFLOP/s vs the dense bf16 rate, and
//              its GPU time per op group from events around each op (`bf16_split` in the JSON);
//   offload    a stage-3 step with the device budget cut to a quarter of the resident run's
//              persistent bytes (plus its activations), parameters and optimizer state on NVMe,
//              vs the resident step (ratio = offloaded / resident step time, lower is better).
// Without CUDA (build or GPU) it is an error that says which.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "zoe/status.h"

namespace zoe {

struct GpuBenchOptions {
  size_t copy_bytes = size_t{1} << 30;
  size_t adam_elems = size_t{256} << 20;
  int iters = 10;             // timed repetitions of copies and Adam; the best is reported
  std::string nvme_dir = "out/nvme";
  std::string python;         // empty: the first python3 that imports torch
  bool torch = true;
  bool torch_compile = false;  // also PyTorch torch.compile + autocast (its compile takes a minute or more)
  bool smoke = false;          // every row at toy sizes, no peer: that the bench runs (the emulated GPU's test)
};

Status bench_gpu(const GpuBenchOptions& o, nlohmann::json* out, std::FILE* human);

// A PCIe link's rated data rate in GB/s per direction from sysfs's current_link_speed
// ("32.0 GT/s PCIe") and current_link_width ("16"): GT/s x lanes x 128/130 (Gen 3 on; 8/10 below
// 8 GT/s) / 8. 0 when either does not parse.
double pcie_rated_gbps(const std::string& link_speed, const std::string& link_width);
// Dense bf16 TFLOP/s of a GPU by its name, from NVIDIA's data sheets; 0 when not listed.
double rated_bf16_tflops(const std::string& name);

}  // namespace zoe

// `zoe bench <what>`: dispatch to the benchmarks in bench/.
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "adam_bench.h"
#include "comm_bench.h"
#include "gemm_bench.h"
#include "gpu_bench.h"
#include "nvme_bench.h"
#include "offload_bench.h"
#include "step_bench.h"

namespace zoe::cli {

namespace {
Result<std::vector<size_t>> parse_sizes(const std::vector<std::string>& in) {
  std::vector<size_t> out;
  for (const auto& s : in) {
    size_t pos = 0;
    double v = 0;
    try {
      v = std::stod(s, &pos);
    } catch (...) {
      pos = 0;
    }
    // Converting a double past size_t's range is undefined behaviour: bound it first (2^48, 256 Ti,
    // is past any memory these benchmarks can fill).
    if (pos != s.size() || !(v >= 1 && v <= 0x1p48) || v != std::floor(v))
      return Status::Invalid(fmt::format("--size '{}': expected a whole number from 1 to 2^48", s));
    out.push_back(static_cast<size_t>(v));
  }
  return out;
}
}  // namespace

int bench_command(const BenchArgs& a) {
  auto sizes = parse_sizes(a.sizes);
  if (!sizes.ok()) return report_error(sizes.status());
  nlohmann::json out;
  Status st;
  std::FILE* human = a.json ? nullptr : stdout;
  if (a.what == "comm") {
    CommBenchOptions o;
    o.sizes = sizes.value();
    if (a.iters > 0) o.iters = a.iters;
    st = bench_comm(o, &out, human);
  } else if (a.what == "adam") {
    BenchAdamOptions o;
    if (!a.sizes.empty()) {
      o.sizes.clear();
      o.sizes = sizes.value();
    }
    if (!a.threads.empty()) o.threads = a.threads;
    if (a.iters > 0) o.iterations = a.iters;
    o.torch = !a.no_torch;
    if (!a.python.empty()) o.python = a.python;
    st = bench_adam(o, &out, human);
  } else if (a.what == "step") {
    StepBenchOptions o;
    o.threads = a.threads;
    if (a.iters > 0) o.iters = a.iters;
    o.torch = !a.no_torch;
    o.python = a.python;
    o.bf16 = a.dtype == "bf16";
    st = bench_step(o, &out, human);
  } else if (a.what == "gemm") {
    GemmBenchOptions o;
    o.threads = a.threads;
    if (a.iters > 0) o.reps = a.iters;
    if (!a.dtype.empty()) o.types = {a.dtype == "bf16" ? GemmType::kBF16 : GemmType::kF32};
    st = bench_gemm(o, &out, human);
  } else if (a.what == "nvme") {
    NvmeBenchOptions o;
    if (sizes.value().size() > 1) return report_error(Status::Invalid("bench nvme: one --size (the file's bytes)"));
    if (!sizes.value().empty()) o.file_bytes = sizes.value()[0];
    if (a.aio_block_size > 0) o.block_sizes = {static_cast<uint32_t>(a.aio_block_size)};
    if (a.aio_queue_depth > 0) o.queue_depths = {static_cast<unsigned>(a.aio_queue_depth)};
    o.checksum_rows = !a.no_checksums;
    if (a.iters > 0) o.reps = a.iters;
    if (!a.dir.empty()) o.dir = a.dir;
    st = bench_nvme(o, &out, human);
  } else if (a.what == "gpu") {
    GpuBenchOptions o;
    if (a.iters > 0) o.iters = a.iters;
    if (!a.dir.empty()) o.nvme_dir = a.dir;
    o.torch = !a.no_torch;
    o.torch_compile = a.torch_compile;
    o.smoke = a.smoke;
    o.python = a.python;
    st = bench_gpu(o, &out, human);
  } else if (a.what == "offload") {
    OffloadBenchOptions o;
    if (a.iters > 0) o.iters = a.iters;
    if (!a.dir.empty()) o.nvme_dir = a.dir;
    o.trace_path = a.trace;
    o.checksums = !a.no_checksums;
    if (a.aio_block_size > 0) o.aio_block_size = a.aio_block_size;
    if (a.aio_queue_depth > 0) o.aio_queue_depth = a.aio_queue_depth;
    if (a.threads.size() > 1) return report_error(Status::Invalid("bench offload: one --threads"));
    if (!a.threads.empty()) o.threads = a.threads[0];
    if (!a.device.empty()) o.device = a.device;
    if (a.smoke) {  // a model the emulated GPU steps in seconds (a CUDA device's allocator needs a
                    // budget of a few MB), one round without warm-up
      o.shape = {/*n_layer=*/4, /*n_head=*/3, /*n_embd=*/192, /*vocab_size=*/256, /*n_positions=*/64};
      o.T = 32;
      o.warmup = 0;
      o.iters = 1;
    }
    st = bench_offload(o, &out, human);
  } else if (a.what == "copy") {
    st = Status::Unsupported(fmt::format("bench '{}' is not available in this build yet", a.what));
  } else {
    st = Status::Invalid(fmt::format("bench '{}': expected one of adam, comm, gemm, gpu, nvme, offload, copy, step", a.what));
  }
  if (!st.ok()) return report_error(st);
  if (a.json && !out.is_null()) fmt::print("{}\n", out.dump(2));
  return 0;
}

}  // namespace zoe::cli

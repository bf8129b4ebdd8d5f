// `zoe info`: what this binary is and what it finds on this machine.
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/version.h"
#include "kernels/adam.h"
#include "kernels/gemm.h"
#include "train/backend.h"
#include "train/trainer.h"
#ifdef ZOE_HAVE_CUDA
#include "gpu/cublaslt_library.h"
#include "gpu/cudnn_attention.h"
#include "gpu/gpu_info.h"
#include "gpu/nccl_library.h"
#endif

namespace zoe::cli {

int info_command() {
  fmt::print("zoe {}\n", version_string());
  fmt::print("backends compiled: {}\n", fmt::join(backends_compiled(), ", "));
  fmt::print("build: {} {}, {}, comm: MPI + single rank, GEMM: OpenBLAS{}, threads: oneTBB\n", ZOE_COMPILER,
             __VERSION__, ZOE_BUILD_TYPE, gemm_onednn_isa() == "absent" ? "" : " + oneDNN");
  fmt::print("cpu: {} threads, best ISA {} (avx512 {}, avx2 {})\n", std::thread::hardware_concurrency(),
             isa_name(best_isa()), isa_supported(Isa::kAvx512) ? "yes" : "no", isa_supported(Isa::kAvx2) ? "yes" : "no");
  for (GemmType t : {GemmType::kF32, GemmType::kBF16}) {
    auto p = gemm_path(t);
    fmt::print("gemm {}: {}\n", gemm_type_name(t),
               p.ok() ? fmt::format("{} (oneDNN finds {})", gemm_path_name(*p), gemm_onednn_isa()) : p.status().message());
  }
  Config bf16_job;  // the default device (cpu), GPT-2, bf16 weights, zoe.compute_dtype auto
  bf16_job.model_type = "gpt2";
  bf16_job.dtype = DType::kBF16;
  const bool units = resolve_compute_dtype(bf16_job) == "bf16";
  fmt::print("bf16 training computes in: {} (zoe.compute_dtype auto on the cpu device; {})\n", units ? "bf16" : "fp32",
             units ? "bf16 products on this CPU's bf16 units" : "no bf16 units here: bf16 products would be fp32 ones on widened operands");
#ifdef ZOE_HAVE_CUDA
  std::string why;
  auto gpus = gpu::list_gpus(&why);
  if (gpus.empty()) fmt::print("gpus: none ({})\n", why);
  for (auto& g : gpus) {
    // Free now, and the budget "auto" (zoe.device_memory_budget's default) would make of it.
    size_t free = 0;
    std::string budget = gpu::free_bytes(g.index, &free, &why) ? fmt::format("{:.1f} GiB free", free / 1073741824.0) : why;
    if (free >= kAutoDeviceMargin + kAutoDeviceLeast)
      budget += fmt::format(": zoe.device_memory_budget \"auto\" {:.1f} GiB", (free - kAutoDeviceMargin) / 1073741824.0);
    fmt::print("gpu {}: {} sm_{}{} {:.1f} GiB, {}\n", g.index, g.name, g.sm_major, g.sm_minor,
               g.total_bytes / 1073741824.0, budget);
  }
  // (loaded only at their first use; named here so a user sees which files a GPU job will load)
  fmt::print("gpu libraries: {}; {} (more than one GPU only)\n", gpu::cublaslt_text(), gpu::nccl_text());
  fmt::print("gpu bf16 attention: cuDNN's fused attention where it runs the shape, else zoe's tensor-core kernels "
             "(ZOE_CUDA_ATTENTION); cuDNN: {}\n",
             gpu::CudnnAttention::version_text());
#else
  fmt::print("gpus: not looked for (built without CUDA)\n");
#endif
  return 0;
}

}  // namespace zoe::cli

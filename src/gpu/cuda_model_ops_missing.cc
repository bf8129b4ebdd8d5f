// TEMPORARY — delete when the branch with the CUDA model ops (src/gpu/cuda_model_ops.cu) is
// merged. A weak default of make_cuda_model_ops so zoe_gpu links before those ops exist; the
// real definition replaces it. Called, it stops the process with a line saying what is missing
// (CudaDevice::ops() returns a reference, so there is no Status to return).
#include <cstdio>
#include <cstdlib>

#include "gpu/cuda_model_ops.h"

namespace zoe::gpu {

__attribute__((weak)) std::unique_ptr<ModelOps> make_cuda_model_ops(cudaStream_t) {
  std::fprintf(stderr,
               "zoe: internal error: this build has no CUDA model ops (src/gpu/cuda_model_ops.cu is "
               "missing), so the cuda device cannot run a model\n");
  std::abort();
}

}  // namespace zoe::gpu

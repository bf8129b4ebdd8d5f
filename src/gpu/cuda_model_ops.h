// PLACEHOLDER — the branch with the CUDA model ops brings the real header at this path (the
// CudaModelOps class and this factory); take that one when merging, with this declaration
// unchanged, and delete src/gpu/cuda_model_ops_missing.cc.
//
// The CUDA implementation of ModelOps (model/model_ops.h): the model's kernels on a CUDA stream.
// CudaDevice::ops() builds it on first use, on the device's compute stream.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "model/model_ops.h"

namespace zoe::gpu {

// Model ops enqueued on `compute_stream` (the stream outlives them).
std::unique_ptr<ModelOps> make_cuda_model_ops(cudaStream_t compute_stream);

}  // namespace zoe::gpu

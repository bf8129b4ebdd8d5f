// The CUDA implementation of ModelOps (model/model_ops.h): the model's kernels on a CudaDevice's
// compute stream. CudaDevice::ops() builds it on first use.
#pragma once
#include <memory>

#include "model/model_ops.h"

namespace zoe {

class CudaDevice;

// The model ops of `dev`, enqueued on dev.stream(Stream::kCompute); `dev` outlives them.
std::unique_ptr<ModelOps> make_cuda_model_ops(CudaDevice& dev);

}  // namespace zoe

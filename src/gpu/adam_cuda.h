// Fused Adam / AdamW on the GPU: the CPU kernel's semantics (kernels/adam.h, kernels/adam_kernels.h)
// in one multi-tensor launch per batch of ranges.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/adam.h"
#include "zoe/status.h"

namespace zoe::gpu {

// Enqueues on `stream` the update of every range (all pointers device pointers; ranges of any
// dtype mix, any length, any alignment: 16-byte accesses where the pointers allow) and adds the
// count of non-finite gradient elements, whose state is left untouched, to *d_nonfinite (device
// memory; may be null). Does not wait for the GPU. Results are bitwise equal to the CPU paths.
Status adam_step_cuda(const AdamHyper& h, const AdamRange* ranges, size_t count, cudaStream_t stream,
                      unsigned long long* d_nonfinite);

}  // namespace zoe::gpu

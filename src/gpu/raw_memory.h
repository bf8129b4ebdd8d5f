// RawMemory: where a GPU component gets device memory from. The CUDA device hands its ops a
// pair that allocates from its budgeted caching allocator (so the cuBLASLt and cuDNN workspaces
// and the ops' scratch are inside zoe.device_memory_budget and in the ledger, as PyTorch's
// allocator holds its cuBLAS workspaces); the caching allocator's own is cudaMalloc/cudaFree.
#pragma once
#include <cstddef>
#include <functional>

#include "zoe/status.h"

namespace zoe::gpu {

// malloc returns memory or a Status saying why not (out of memory, a budget, a broken driver);
// free takes back what malloc returned, and need not wait for work in flight (a caching
// allocator hands the block on at once): a caller frees only what no queued work uses.
struct RawMemory {
  std::function<Result<void*>(size_t bytes)> malloc;
  std::function<void(void* p)> free;
};

// cudaMalloc and cudaFree (the error cleared and named): for ops built outside a CudaDevice.
RawMemory cuda_raw_memory();

// *out = m.malloc(bytes); else *out is null and the error says "<what> (<bytes> bytes): why".
Status take_raw(const RawMemory& m, size_t bytes, const char* what, void** out);

}  // namespace zoe::gpu

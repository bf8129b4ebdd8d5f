#include "gpu/raw_memory.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

namespace zoe::gpu {

RawMemory cuda_raw_memory() {
  return RawMemory{[](size_t n) -> Result<void*> {
                     void* p = nullptr;
                     const cudaError_t e = cudaMalloc(&p, n);
                     if (e == cudaSuccess) return p;
                     cudaGetLastError();
                     return Status::OutOfMemory(
                         fmt::format("cudaMalloc: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e)));
                   },
                   [](void* p) { cudaFree(p); }};
}

Status take_raw(const RawMemory& m, size_t bytes, const char* what, void** out) {
  *out = nullptr;
  Result<void*> p = m.malloc(bytes);
  if (!p.ok()) return p.status().prefixed(fmt::format("{} ({} bytes): ", what, bytes));
  *out = *p;
  return Status::Ok();
}

}  // namespace zoe::gpu

#include <cuda_runtime.h>

#include "gpu/cuda_kernel_util.cuh"
#include "gpu/gpu_info.h"

namespace zoe::gpu {

std::vector<GpuInfo> list_gpus(std::string* why) {
  std::vector<GpuInfo> out;
  // Without a driver cudaGetDeviceCount returns an error and leaves `n` unwritten: initialise it.
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("CUDA runtime: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.totalGlobalMem, p.major, p.minor});
  }
  if (out.empty() && why) *why = "no CUDA device found";
  return out;
}

__global__ void smoke(int* v) { *v = 42; }

bool smoke_kernel(std::string* why) {
  int* d = nullptr;
  int h = 0;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) {
    if (why) *why = "cudaMalloc failed";
    return false;
  }
  ZOE_LAUNCH(1, 1, 0, 0, smoke)(d);
  cudaError_t e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess || h != 42) {
    if (why) *why = std::string("smoke kernel: ") + cudaGetErrorString(e);
    return false;
  }
  return true;
}

}  // namespace zoe::gpu

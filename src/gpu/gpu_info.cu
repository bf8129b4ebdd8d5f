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

bool free_bytes(int index, size_t* free, std::string* why) {
  size_t total = 0;
  cudaError_t e = cudaSetDevice(index);
  if (e == cudaSuccess) e = cudaMemGetInfo(free, &total);
  if (e == cudaSuccess) return true;
  if (why) *why = std::string("cudaMemGetInfo of GPU ") + std::to_string(index) + ": " + cudaGetErrorName(e);
  cudaGetLastError();
  return false;
}

__global__ void smoke(int* v) { *v = 42; }

bool smoke_kernel(std::string* why) {
  int* d = nullptr;
  int h = 0;
  auto failed = [&](const char* what, cudaError_t e) {
    if (why) *why = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    return false;
  };
  if (cudaError_t e = cudaMalloc(&d, sizeof(int)); e != cudaSuccess) return failed("cudaMalloc", e);
  ZOE_LAUNCH(1, 1, 0, 0, smoke)(d);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t copied = launched == cudaSuccess ? cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) : launched;
  // A failed copy may leave the kernel queued: it finishes before its memory goes.
  if (copied != cudaSuccess) cudaDeviceSynchronize();
  cudaFree(d);
  if (launched != cudaSuccess) return failed("smoke kernel launch", launched);
  if (copied != cudaSuccess) return failed("smoke kernel", copied);
  if (h != 42) {
    if (why) *why = "the smoke kernel ran but did not write its result";
    return false;
  }
  return true;
}

}  // namespace zoe::gpu

// Small device helpers shared by the model kernels (cuda_model_kernels.cuh, cuda_attention.cuh).
//
// Two macros stand for the only CUDA syntax the kernels use beyond plain C++, so that the same
// kernel source also compiles for the CPU emulation in tools/cuda_emu (which defines them first):
//   ZOE_DYNAMIC_SMEM(name)  declares the launch's dynamic shared memory as `float name[]`;
//   ZOE_LAUNCH(grid, block, smem_bytes, stream, kernel)(args...)  launches `kernel`;
//   ZOE_KERNEL_SPAN(p, bytes, write)  says, before a launch, which bytes it touches (the
//   emulation's race check; nothing on a GPU).
#pragma once
#include <cstdint>

#include "gpu/dtype_bits.h"

#ifndef ZOE_DYNAMIC_SMEM
#define ZOE_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif
#ifndef ZOE_KERNEL_SPAN
#define ZOE_KERNEL_SPAN(p, bytes, write) ((void)0)
#endif
#ifndef ZOE_LAUNCH
#define ZOE_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
#endif

namespace zoe::gpu::kernels {

constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly reductions over the 32 lanes of a warp. Every lane ends with the same bits: at each
// step lanes i and i^o add the same two values, and IEEE addition is commutative. The order is
// fixed, so the result is deterministic.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024; every thread must call).
// `red` is 32 elements of shared memory; every thread gets the result. The leading barrier
// lets consecutive calls share `red`: no warp writes it while another still reads the last result.
template <class Tv, class Op>
__device__ __forceinline__ Tv block_reduce(Tv v, Tv* red, Tv identity, Op op) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  // Every warp reduces the per-warp values the same way, so all threads hold the same result.
  Tv r = lane < nw ? red[lane] : identity;
  return op(r);
}
struct WarpSumF {
  __device__ float operator()(float v) const { return warp_sum(v); }
};
struct WarpSumD {
  __device__ double operator()(double v) const { return warp_sum(v); }
};
struct WarpMaxF {
  __device__ float operator()(float v) const { return warp_max(v); }
};
__device__ __forceinline__ float block_sum(float v, float* red) {
  return block_reduce(warp_sum(v), red, 0.f, WarpSumF{});
}
__device__ __forceinline__ double block_sum(double v, double* red) {
  return block_reduce(warp_sum(v), red, 0.0, WarpSumD{});
}
__device__ __forceinline__ float block_max(float v, float* red) {
  return block_reduce(warp_max(v), red, -INFINITY, WarpMaxF{});
}

// Grid-stride loops over int64 ranges.
__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// An output element: fp32 as computed, or rounded to bf16 (bf16 compute's product inputs).
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(uint16_t* p, float v) { *p = bits::f32_to_bf16(v); }
// An input element in fp32: as stored, or widened from bf16 bits.
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(uint16_t x) { return bits::bf16_to_f32(x); }

constexpr int kThreads = 256;  // threads per block of the row and elementwise kernels

// A row-major matrix read as fp32 (bf16 widened): the values a column sum adds
// (cuda_model_kernels.cuh's column_partial_kernel: a product's dbias; RowsOf<uint16_t>: c_attn's
// dbias from the dqkv cuDNN's attention rounded).
template <class T>
struct RowsOf {
  const T* x;
  int ld;
  __device__ float operator()(int64_t r, int c) const { return widen(x[r * ld + c]); }
};
using Rows = RowsOf<float>;

}  // namespace zoe::gpu::kernels

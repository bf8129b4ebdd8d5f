// A CPU emulation of the little CUDA the model kernels use, to run cuda_model_ops.cu and its test
// on a machine without a GPU (tools/cuda_emu/run.sh). Force-included (g++ -include) before the
// .cu, which is then compiled as C++.
//
// Blocks run one after another; the threads of a block are fibers (ucontext) on one OS thread,
// switched only at __syncthreads and warp shuffles, so shared memory can be plain statics.
// What it checks beyond the arithmetic: a barrier or shuffle that not every live thread (lane)
// reaches aborts with a message, as does a shuffle whose partner lane has exited; dynamic shared
// memory and cudaMalloc'd memory start as NaN, so reading what was never written shows up.
// What it cannot check: real races (fibers never run concurrently), timing, register / shared
// memory limits, the real cuBLASLt (cuda_emu_runtime.cc has a naive column-major GEMM that checks
// the layouts and the alignments promised to the heuristic).
#pragma once
#define ZOE_CUDA_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>

#undef __shared__
#define __shared__ static
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu {

struct Dims {
  dim3 grid, block;
  uint3 block_idx, thread_idx;
};
Dims& dims();

void syncthreads();
// Exchanges v with lane (lane ^ offset) of the warp; both must call.
double shfl_xor(double v, int offset);
float* dynamic_smem();
// Runs body() once per thread of every block of the grid.
void run_grid(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body);

struct Launch {
  dim3 grid, block;
  size_t smem;
  template <class... P, class... A>
  void operator()(void (*kernel)(P...), A&&... args) const {
    std::tuple<P...> bound(static_cast<P>(args)...);
    run_grid(grid, block, smem, [&] { std::apply(kernel, bound); });
  }
};

template <class K>
struct Bound {
  Launch l;
  K* kernel;
  template <class... A>
  void operator()(A&&... args) const {
    l(kernel, std::forward<A>(args)...);
  }
};
template <class K>
Bound<K> bind(dim3 grid, dim3 block, size_t smem, K* kernel) {
  return {{grid, block, smem}, kernel};
}

}  // namespace emu

#define threadIdx (::emu::dims().thread_idx)
#define blockIdx (::emu::dims().block_idx)
#define blockDim (::emu::dims().block)
#define gridDim (::emu::dims().grid)
#define __syncthreads() ::emu::syncthreads()

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int offset) {
  return static_cast<T>(::emu::shfl_xor(static_cast<double>(v), offset));
}

#define ZOE_DYNAMIC_SMEM(name) float* name = ::emu::dynamic_smem()
#define ZOE_LAUNCH(grid, block, smem, stream, ...) ::emu::bind(dim3(grid), dim3(block), (smem), __VA_ARGS__)

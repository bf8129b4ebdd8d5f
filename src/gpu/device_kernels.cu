// Kernels of the CUDA device: accumulate, sum_chunks, sum_squares (see device_kernels.h).
// Every float operation is an explicit round-to-nearest intrinsic, so nvcc neither contracts
// nor approximates anything (and subnormals are kept: zoe never builds with fast math).
#include <cuda_runtime.h>

#include <string>

#include "gpu/cuda_kernel_util.cuh"
#include "gpu/device_kernels.h"
#include "gpu/dtype_bits.h"

namespace zoe::gpu {
namespace {

constexpr int kThreads = 256;

constexpr uint8_t kF32 = uint8_t(DType::kF32);
constexpr uint8_t kBF16 = uint8_t(DType::kBF16);
constexpr uint8_t kF16 = uint8_t(DType::kF16);

template <uint8_t T>
__device__ __forceinline__ float load(const void* p, uint64_t i) {
  if constexpr (T == kF32) return static_cast<const float*>(p)[i];
  else if constexpr (T == kBF16) return bits::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  else return bits::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}
template <uint8_t T>
__device__ __forceinline__ void store(void* p, uint64_t i, float v) {
  if constexpr (T == kF32) static_cast<float*>(p)[i] = v;
  else if constexpr (T == kBF16) static_cast<uint16_t*>(p)[i] = bits::f32_to_bf16(v);
  else static_cast<uint16_t*>(p)[i] = bits::f32_to_f16(v);
}

// --- accumulate ------------------------------------------------------------------------------

template <uint8_t D, uint8_t S, bool kAcc>
__global__ void __launch_bounds__(kThreads) accumulate_kernel(void* dst, const void* src, uint64_t n) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = load<S>(src, i);
    if constexpr (kAcc) v = bits::add_x86(load<D>(dst, i), v);
    store<D>(dst, i, v);
  }
}

unsigned grid_for(uint64_t n, int max_blocks) {
  const uint64_t want = (n + kThreads - 1) / kThreads;
  const uint64_t cap = max_blocks > 0 ? uint64_t(max_blocks) : 1;
  return static_cast<unsigned>(want < cap ? want : cap);
}

Status launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status::Runtime(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(e));
  return Status::Ok();
}

template <uint8_t D, uint8_t S>
void launch_accumulate(void* dst, const void* src, uint64_t n, bool acc, unsigned grid, cudaStream_t s) {
  ZOE_KERNEL_SPAN(dst, n * dtype_size(DType(D)), true);
  ZOE_KERNEL_SPAN(src, n * dtype_size(DType(S)), false);
  if (acc) ZOE_LAUNCH(grid, kThreads, 0, s, accumulate_kernel<D, S, true>)(dst, src, n);
  else ZOE_LAUNCH(grid, kThreads, 0, s, accumulate_kernel<D, S, false>)(dst, src, n);
}
template <uint8_t D>
void launch_accumulate(uint8_t st, void* dst, const void* src, uint64_t n, bool acc, unsigned grid, cudaStream_t s) {
  switch (st) {
    case kF32: launch_accumulate<D, kF32>(dst, src, n, acc, grid, s); break;
    case kBF16: launch_accumulate<D, kBF16>(dst, src, n, acc, grid, s); break;
    default: launch_accumulate<D, kF16>(dst, src, n, acc, grid, s); break;
  }
}

// --- sum_chunks ------------------------------------------------------------------------------

template <uint8_t T>
__global__ void __launch_bounds__(kThreads) sum_chunks_kernel(void* out, const void* chunks, int n, uint64_t count) {
  const char* base = static_cast<const char*>(chunks);
  const uint64_t chunk_bytes = count * (T == kF32 ? 4 : 2);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float s = load<T>(base, i);
    for (int k = 1; k < n; ++k) s = bits::add_x86(s, load<T>(base + k * chunk_bytes, i));
    store<T>(out, i, s);
  }
}

// --- sum_squares -----------------------------------------------------------------------------

constexpr int kMaxSpans = 96;  // spans per launch: the arguments stay under 4 KiB
constexpr int kTotalThreads = 1024;

struct SpanArg {
  const void* x;
  uint64_t n;
  uint64_t first_block;  // among the launch's blocks
  uint8_t dtype;
};
struct SquaresArgs {
  uint64_t total_blocks;  // of this launch
  uint64_t partial_base;  // the launch's first partial
  int count;
  SpanArg s[kMaxSpans];
};
static_assert(sizeof(SquaresArgs) <= 4096, "kernel arguments are limited to 4 KiB");

template <uint8_t T>
__device__ __forceinline__ double squares(const void* x, uint64_t begin, uint64_t end) {
  double acc = 0.0;
  for (uint64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double v = static_cast<double>(load<T>(x, i));
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  return acc;
}

// One partial per block of 65536 elements; blocks of the grid walk them grid-stride (the
// partial of a block does not depend on which CUDA block computes it).
__global__ void __launch_bounds__(kThreads) squares_partials_kernel(const __grid_constant__ SquaresArgs a,
                                                                    double* partials) {
  __shared__ double sh[kThreads];
  for (uint64_t b = blockIdx.x; b < a.total_blocks; b += gridDim.x) {
    int lo = 0, hi = a.count - 1;  // the last span whose first block is <= b
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (a.s[mid].first_block <= b) lo = mid;
      else hi = mid - 1;
    }
    const SpanArg& s = a.s[lo];
    const uint64_t begin = (b - s.first_block) * kSumSquaresBlock;
    const uint64_t end = begin + kSumSquaresBlock < s.n ? begin + kSumSquaresBlock : s.n;
    double acc;
    switch (s.dtype) {
      case kF32: acc = squares<kF32>(s.x, begin, end); break;
      case kBF16: acc = squares<kBF16>(s.x, begin, end); break;
      default: acc = squares<kF16>(s.x, begin, end); break;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int off = kThreads / 2; off > 0; off >>= 1) {
      if (int(threadIdx.x) < off) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + off]);
      __syncthreads();
    }
    if (threadIdx.x == 0) partials[a.partial_base + b] = sh[0];
    __syncthreads();  // sh is reused by the next block of the walk
  }
}

// *out += the sum of n partials: thread t sums slice t in order, then a fixed tree.
__global__ void __launch_bounds__(kTotalThreads) squares_total_kernel(const double* partials, uint64_t n, double* out) {
  __shared__ double sh[kTotalThreads];
  const uint64_t per = (n + kTotalThreads - 1) / kTotalThreads;
  const uint64_t lo = uint64_t(threadIdx.x) * per;
  const uint64_t hi = lo + per < n ? lo + per : n;
  double acc = 0.0;
  for (uint64_t i = lo; i < hi; ++i) acc = __dadd_rn(acc, partials[i]);
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int off = kTotalThreads / 2; off > 0; off >>= 1) {
    if (int(threadIdx.x) < off) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + off]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = __dadd_rn(*out, sh[0]);
}

bool valid_dtype(DType t) { return uint8_t(t) <= kF16; }

}  // namespace

Status accumulate_cuda(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, bool accumulate,
                       cudaStream_t stream, int max_blocks) {
  if (!valid_dtype(dst_dtype) || !valid_dtype(src_dtype)) return Status::Invalid("accumulate: unknown dtype");
  if (n == 0) return Status::Ok();
  if (!dst || !src) return Status::Invalid("accumulate: null pointer");
  const unsigned grid = grid_for(n, max_blocks);
  const uint8_t st = uint8_t(src_dtype);
  switch (uint8_t(dst_dtype)) {
    case kF32: launch_accumulate<kF32>(st, dst, src, n, accumulate, grid, stream); break;
    case kBF16: launch_accumulate<kBF16>(st, dst, src, n, accumulate, grid, stream); break;
    default: launch_accumulate<kF16>(st, dst, src, n, accumulate, grid, stream); break;
  }
  return launched("accumulate");
}

Status sum_chunks_cuda(void* out, const void* chunks, int n, size_t count, DType dtype, cudaStream_t stream,
                       int max_blocks) {
  if (!valid_dtype(dtype)) return Status::Invalid("sum_chunks: unknown dtype");
  if (n < 1) return Status::Invalid("sum_chunks: needs at least one chunk, got " + std::to_string(n));
  if (count == 0) return Status::Ok();
  if (!out || !chunks) return Status::Invalid("sum_chunks: null pointer");
  const unsigned grid = grid_for(count, max_blocks);
  // Exactly the elements it touches, as launch_accumulate's: a reduction lands in one unit's slice
  // of the gradient shard while the update reads another's (not the whole block, for the race check).
  ZOE_KERNEL_SPAN(out, count * dtype_size(dtype), true);
  ZOE_KERNEL_SPAN(chunks, n * count * dtype_size(dtype), false);
  switch (uint8_t(dtype)) {
    case kF32: ZOE_LAUNCH(grid, kThreads, 0, stream, sum_chunks_kernel<kF32>)(out, chunks, n, count); break;
    case kBF16: ZOE_LAUNCH(grid, kThreads, 0, stream, sum_chunks_kernel<kBF16>)(out, chunks, n, count); break;
    default: ZOE_LAUNCH(grid, kThreads, 0, stream, sum_chunks_kernel<kF16>)(out, chunks, n, count); break;
  }
  return launched("sum_chunks");
}

uint64_t sum_squares_partials(const ArrayView* spans, size_t count) {
  uint64_t p = 0;
  for (size_t i = 0; i < count; ++i) p += (spans[i].n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  return p;
}

Status sum_squares_cuda(const ArrayView* spans, size_t count, double* partials, double* out, cudaStream_t stream,
                        int max_blocks) {
  if (count > 0 && !spans) return Status::Invalid("sum_squares: spans is null");
  if (!out) return Status::Invalid("sum_squares: out is null");
  for (size_t i = 0; i < count; ++i) {
    if (spans[i].n == 0) continue;
    if (!spans[i].x) return Status::Invalid("sum_squares: span " + std::to_string(i) + " is null");
    if (!valid_dtype(spans[i].dtype)) return Status::Invalid("sum_squares: span " + std::to_string(i) + " has an unknown dtype");
  }
  const uint64_t total = sum_squares_partials(spans, count);
  if (total == 0) return Status::Ok();
  if (!partials) return Status::Invalid("sum_squares: partials is null");
  const uint64_t cap = max_blocks > 0 ? uint64_t(max_blocks) : 1;
  SquaresArgs a{};
  auto flush = [&]() -> Status {
    if (a.count == 0) return Status::Ok();
    const unsigned grid = static_cast<unsigned>(a.total_blocks < cap ? a.total_blocks : cap);
    // What the struct's spans touch, for the emulation's race checks (no-op on CUDA).
    for (int i = 0; i < a.count; ++i) ZOE_KERNEL_SPAN(a.s[i].x, a.s[i].n * dtype_size(DType(a.s[i].dtype)), false);
    ZOE_KERNEL_SPAN(partials + a.partial_base, a.total_blocks * sizeof(double), true);
    ZOE_LAUNCH(grid, kThreads, 0, stream, squares_partials_kernel)(a, partials);
    ZOE_RETURN_IF_ERROR(launched("sum_squares"));
    a.partial_base += a.total_blocks;
    a.total_blocks = 0;
    a.count = 0;
    return Status::Ok();
  };
  for (size_t i = 0; i < count; ++i) {
    if (spans[i].n == 0) continue;
    if (a.count == kMaxSpans) ZOE_RETURN_IF_ERROR(flush());
    a.s[a.count++] = SpanArg{spans[i].x, spans[i].n, a.total_blocks, uint8_t(spans[i].dtype)};
    a.total_blocks += (spans[i].n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  }
  ZOE_RETURN_IF_ERROR(flush());
  ZOE_LAUNCH(1, kTotalThreads, 0, stream, squares_total_kernel)(partials, total, out);
  return launched("sum_squares (total)");
}

}  // namespace zoe::gpu

// The CUDA device's own kernels (Device::accumulate, sum_chunks, sum_squares), enqueued on a
// stream; they return at once (launch errors only). All pointers are device memory or host
// memory the device can reach.
//
// accumulate and sum_chunks are bitwise those of the CPU device: elements are converted with
// zoe/dtype.h's exact conversions (gpu/dtype_bits.h, checked against dtype.h on the CPU by
// tests/dtype_bits_test.cc; NaN payloads kept), summed in fp32 in the CPU's order with x86 SSE's
// NaN rule (a NaN operand is returned quieted, the first one when both are; an invalid sum such
// as inf - inf gives the default NaN 0xffc00000), where the GPU itself would return its
// canonical NaN. (Where both operands are NaNs with different payloads the CPU's result depends
// on the order its compiler put the operands in; that case alone is not pinned down.)
//
// sum_squares is deterministic, not bitwise the CPU's: the elements of each span are cut into
// fixed blocks of 65536; each block's float64 sum of squares is one partial (256 threads, each
// summing every 256th element in order, then a fixed tree), and the partials of all spans, in
// span and block order, are summed by one block of 1024 threads over fixed slices and a fixed
// tree. No step depends on the launch shape or the GPU.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "zoe/device.h"
#include "zoe/status.h"

namespace zoe::gpu {

// dst[i] = (accumulate ? dst[i] : 0) + src[i], in fp32, stored as dst_dtype (see Device).
Status accumulate_cuda(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, bool accumulate,
                       cudaStream_t stream, int max_blocks);

// out[i] = chunk 0's element i + chunk 1's + ... in that order, in fp32 (see Device).
Status sum_chunks_cuda(void* out, const void* chunks, int n, size_t count, DType dtype, cudaStream_t stream,
                       int max_blocks);

inline constexpr uint64_t kSumSquaresBlock = uint64_t{1} << 16;

// How many float64 partials sum_squares_cuda needs for these spans (one per 65536 elements of
// each span).
uint64_t sum_squares_partials(const ArrayView* spans, size_t count);

// *out += the sum of squares of every span's elements, in float64 (see above). `partials` holds
// sum_squares_partials(spans, count) doubles of device memory, used until the work completes.
Status sum_squares_cuda(const ArrayView* spans, size_t count, double* partials, double* out, cudaStream_t stream,
                        int max_blocks);

}  // namespace zoe::gpu

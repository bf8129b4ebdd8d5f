// Fused multi-tensor Adam / AdamW kernel. One launch updates up to kMaxRanges ranges: the
// ranges are cut into tiles of kTile elements, numbered across all ranges, and blocks walk the
// tiles grid-stride. Per element it runs the CPU kernels' exact operation order with IEEE
// round-to-nearest intrinsics (no contraction, no fast math), so the results are bitwise those
// of the CPU paths (see kernels/adam_kernels.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gpu/adam_cuda.h"
#include "gpu/cuda_kernel_util.cuh"
#include "kernels/adam_consts.h"

namespace zoe::gpu {
namespace {

constexpr int kMaxRanges = 48;            // the launch arguments stay under 4 KiB
constexpr int kThreads = 256;
constexpr int kGroup = 4;                 // elements per thread access: 16 B of fp32, 8 B of 16-bit
constexpr uint64_t kTile = kThreads * kGroup * 4;
constexpr uint8_t kNoCopy = 3;            // out_dtype when there is no weight copy

struct RangeArg {
  const void* grad;
  float* master;
  float* m;
  float* v;
  void* out;
  uint64_t n;
  uint64_t first_tile;  // the number of this range's first tile among all of the launch's
  uint8_t grad_dtype;   // DType value
  uint8_t out_dtype;    // DType value or kNoCopy
  uint8_t vectorized;   // every pointer 16-byte aligned
};

struct LaunchArgs {
  AdamConsts c;
  uint64_t total_tiles;
  int count;
  uint8_t undo;        // take back the step c made (AdamHyper::undo) instead of stepping
  uint8_t first_step;  // ... from Adam's zero state
  RangeArg r[kMaxRanges];
};
static_assert(sizeof(LaunchArgs) <= 4096, "kernel arguments are limited to 4 KiB");

// The order of kernels/adam_kernels.h; __f*_rn keep nvcc from fusing or approximating anything.
__device__ __forceinline__ bool adam_element(const AdamConsts& c, float grad, float& master, float& m, float& v) {
  float g = __fmul_rn(grad, c.grad_scale);
  if (!isfinite(g)) return false;
  if (c.l2 != 0.0f) g = __fmaf_rn(c.l2, master, g);
  const float p = __fmul_rn(master, c.decay);
  const float m_new = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, g));
  const float v_new = __fmaf_rn(c.beta2, v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fmaf_rn(__fsqrt_rn(v_new), c.inv_sqrt_bc2, c.eps);
  master = __fmaf_rn(c.neg_step_size, __fdiv_rn(m_new, denom), p);
  m = m_new;
  v = v_new;
  return true;
}

// kernels/adam_kernels.h's adam_undo_element, operation for operation.
__device__ __forceinline__ bool undo_element(const AdamConsts& c, bool first_step, float grad, float& master, float& m,
                                             float& v) {
  float g = __fmul_rn(grad, c.grad_scale);
  if (!isfinite(g)) return false;
  const float denom = __fmaf_rn(__fsqrt_rn(v), c.inv_sqrt_bc2, c.eps);
  const float p = __fmaf_rn(-c.neg_step_size, __fdiv_rn(m, denom), master);
  master = __fdiv_rn(p, c.decay);
  if (c.l2 != 0.0f) g = __fmaf_rn(c.l2, master, g);
  if (first_step) {
    m = 0.0f;
    v = 0.0f;
    return true;
  }
  m = __fdiv_rn(__fsub_rn(m, __fmul_rn(c.one_minus_beta1, g)), c.beta1);
  v = fmaxf(0.0f, __fdiv_rn(__fsub_rn(v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g)), c.beta2));
  return true;
}

// dtype.h's conversions: bf16 round to nearest even, NaN -> top half with the quiet bit; fp16
// round to nearest even (the cvt instruction), every NaN -> sign|0x7e00.
__device__ __forceinline__ uint16_t to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ uint16_t to_f16(float f) {
  if (isnan(f)) return static_cast<uint16_t>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(f));
}

template <uint8_t G>
__device__ __forceinline__ float from_grad(const void* grad, uint64_t i) {
  if constexpr (G == uint8_t(DType::kF32)) return static_cast<const float*>(grad)[i];
  const uint16_t h = static_cast<const uint16_t*>(grad)[i];
  if constexpr (G == uint8_t(DType::kBF16)) return __uint_as_float(static_cast<uint32_t>(h) << 16);
  return __half2float(__ushort_as_half(h));
}

template <uint8_t P>
__device__ __forceinline__ void store_copy(void* out, uint64_t i, float p) {
  if constexpr (P == uint8_t(DType::kF32)) static_cast<float*>(out)[i] = p;
  if constexpr (P == uint8_t(DType::kBF16)) static_cast<uint16_t*>(out)[i] = to_bf16(p);
  if constexpr (P == uint8_t(DType::kF16)) static_cast<uint16_t*>(out)[i] = to_f16(p);
}

// One element by itself (unaligned ranges and the last n % kGroup). Returns 1 if not finite.
template <uint8_t G, uint8_t P>
__device__ __forceinline__ unsigned step_one(const AdamConsts& c, const RangeArg& r, uint64_t i) {
  float p = r.master[i], m = r.m[i], v = r.v[i];
  if (!adam_element(c, from_grad<G>(r.grad, i), p, m, v)) return 1;
  r.master[i] = p;
  r.m[i] = m;
  r.v[i] = v;
  store_copy<P>(r.out, i, p);
  return 0;
}

// kGroups groups of kGroup elements, at i, i + stride, ...: each group one 16-byte load or store
// of every fp32 array (8 bytes of a 16-bit one). Neighbouring threads take neighbouring groups, so
// a warp's access is one contiguous 512 bytes (256 for 16-bit); all groups are loaded before any
// is computed, to keep more bytes in flight.
template <uint8_t G, uint8_t P, int kGroups>
__device__ __forceinline__ unsigned step_vec(const AdamConsts& c, const RangeArg& r, uint64_t i, uint64_t stride) {
  constexpr int kN = kGroup * kGroups;
  float p[kN], m[kN], v[kN], g[kN];
  for (int q = 0; q < kGroups; ++q) {
    const uint64_t at = i + q * stride;
    *reinterpret_cast<float4*>(p + q * kGroup) = *reinterpret_cast<const float4*>(r.master + at);
    *reinterpret_cast<float4*>(m + q * kGroup) = *reinterpret_cast<const float4*>(r.m + at);
    *reinterpret_cast<float4*>(v + q * kGroup) = *reinterpret_cast<const float4*>(r.v + at);
    if constexpr (G == uint8_t(DType::kF32)) {
      *reinterpret_cast<float4*>(g + q * kGroup) = *reinterpret_cast<const float4*>(static_cast<const float*>(r.grad) + at);
    } else {
      uint16_t h[kGroup];
      *reinterpret_cast<uint2*>(h) = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(r.grad) + at);
      for (int k = 0; k < kGroup; ++k) g[q * kGroup + k] = from_grad<G>(h, k);
    }
  }
  unsigned finite_bits = 0;
  for (int k = 0; k < kN; ++k) finite_bits |= unsigned(adam_element(c, g[k], p[k], m[k], v[k])) << k;
  // Lanes that were not finite hold what was read: storing them keeps their state bit for bit.
  for (int q = 0; q < kGroups; ++q) {
    const uint64_t at = i + q * stride;
    *reinterpret_cast<float4*>(r.master + at) = *reinterpret_cast<float4*>(p + q * kGroup);
    *reinterpret_cast<float4*>(r.m + at) = *reinterpret_cast<float4*>(m + q * kGroup);
    *reinterpret_cast<float4*>(r.v + at) = *reinterpret_cast<float4*>(v + q * kGroup);
    if constexpr (P == kNoCopy) continue;
    const unsigned bits = (finite_bits >> (q * kGroup)) & ((1u << kGroup) - 1);
    if (bits == (1u << kGroup) - 1) {
      if constexpr (P == uint8_t(DType::kF32)) {
        *reinterpret_cast<float4*>(static_cast<float*>(r.out) + at) = *reinterpret_cast<float4*>(p + q * kGroup);
      } else {
        uint16_t h[kGroup];
        for (int k = 0; k < kGroup; ++k)
          h[k] = P == uint8_t(DType::kBF16) ? to_bf16(p[q * kGroup + k]) : to_f16(p[q * kGroup + k]);
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(r.out) + at) = *reinterpret_cast<uint2*>(h);
      }
    } else {  // rare: only the finite lanes get a new weight copy
      for (int k = 0; k < kGroup; ++k)
        if (bits & (1u << k)) store_copy<P>(r.out, at + k, p[q * kGroup + k]);
    }
  }
  return kN - __popc(finite_bits);
}

// Taking back a speculative step is rare (a clipped or overflowed step): one element a thread.
template <uint8_t G, uint8_t P>
__device__ unsigned undo_tile(const AdamConsts& c, bool first_step, const RangeArg& r, uint64_t begin, uint64_t end) {
  unsigned skipped = 0;
  for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float p = r.master[i], m = r.m[i], v = r.v[i];
    if (undo_element(c, first_step, from_grad<G>(r.grad, i), p, m, v)) {
      r.master[i] = p;
      r.m[i] = m;
      r.v[i] = v;
    } else {
      ++skipped;
    }
    if constexpr (P != kNoCopy) store_copy<P>(r.out, i, p);  // every lane's (AdamHyper::undo)
  }
  return skipped;
}

// Elements [begin, end) of one range by the whole block. begin is a multiple of kGroup.
template <uint8_t G, uint8_t P>
__device__ unsigned step_tile(const AdamConsts& c, const RangeArg& r, uint64_t begin, uint64_t end) {
  unsigned bad = 0;
  uint64_t scalar_from = begin;
  if (r.vectorized) {
    const uint64_t stride = uint64_t(blockDim.x) * kGroup, vec_end = begin + (end - begin) / kGroup * kGroup;
    uint64_t base = begin;
    for (; base + 2 * stride <= vec_end; base += 2 * stride)
      bad += step_vec<G, P, 2>(c, r, base + uint64_t(threadIdx.x) * kGroup, stride);
    for (uint64_t i = base + uint64_t(threadIdx.x) * kGroup; i < vec_end; i += stride)
      bad += step_vec<G, P, 1>(c, r, i, stride);
    scalar_from = vec_end;
  }
  for (uint64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) bad += step_one<G, P>(c, r, i);
  return bad;
}

template <uint8_t G, uint8_t P>
__device__ unsigned tile(const LaunchArgs& a, const RangeArg& r, uint64_t begin, uint64_t end) {
  return a.undo ? undo_tile<G, P>(a.c, a.first_step, r, begin, end) : step_tile<G, P>(a.c, r, begin, end);
}

template <uint8_t G>
__device__ unsigned step_tile_copy(const LaunchArgs& a, const RangeArg& r, uint64_t begin, uint64_t end) {
  switch (r.out_dtype) {
    case uint8_t(DType::kF32): return tile<G, uint8_t(DType::kF32)>(a, r, begin, end);
    case uint8_t(DType::kBF16): return tile<G, uint8_t(DType::kBF16)>(a, r, begin, end);
    case uint8_t(DType::kF16): return tile<G, uint8_t(DType::kF16)>(a, r, begin, end);
    default: return tile<G, kNoCopy>(a, r, begin, end);
  }
}

__global__ void __launch_bounds__(kThreads) adam_kernel(const __grid_constant__ LaunchArgs a,
                                                        unsigned long long* nonfinite) {
  unsigned bad = 0;
  int ri = 0;  // tiles only grow along a block's walk, so the range index only moves forward
  for (uint64_t t = blockIdx.x; t < a.total_tiles; t += gridDim.x) {
    while (ri + 1 < a.count && a.r[ri + 1].first_tile <= t) ++ri;
    const RangeArg& r = a.r[ri];
    const uint64_t begin = (t - r.first_tile) * kTile;
    const uint64_t end = begin + kTile < r.n ? begin + kTile : r.n;
    switch (r.grad_dtype) {
      case uint8_t(DType::kF32): bad += step_tile_copy<uint8_t(DType::kF32)>(a, r, begin, end); break;
      case uint8_t(DType::kBF16): bad += step_tile_copy<uint8_t(DType::kBF16)>(a, r, begin, end); break;
      default: bad += step_tile_copy<uint8_t(DType::kF16)>(a, r, begin, end); break;
    }
  }
  if (!nonfinite) return;
  for (int off = 16; off > 0; off >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, off);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(nonfinite, static_cast<unsigned long long>(bad));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

Status launch(const LaunchArgs& a, int max_blocks, cudaStream_t stream, unsigned long long* nonfinite) {
  if (a.count == 0) return Status::Ok();
  const uint64_t blocks = a.total_tiles < uint64_t(max_blocks) ? a.total_tiles : uint64_t(max_blocks);
#ifdef ZOE_CUDA_EMU  // what the ranges touch, for the emulation's race check (the struct hides them)
  for (int i = 0; i < a.count; ++i) {
    const RangeArg& r = a.r[i];
    ZOE_KERNEL_SPAN(r.grad, r.n * dtype_size(DType(r.grad_dtype)), false);
    for (float* p : {r.master, r.m, r.v}) ZOE_KERNEL_SPAN(p, r.n * 4, true);
    if (r.out_dtype != kNoCopy) ZOE_KERNEL_SPAN(r.out, r.n * dtype_size(DType(r.out_dtype)), true);
  }
  if (nonfinite) ZOE_KERNEL_SPAN(nonfinite, sizeof(*nonfinite), true);
#endif
  ZOE_LAUNCH(static_cast<unsigned>(blocks), kThreads, 0, stream, adam_kernel)(a, nonfinite);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status::Runtime(std::string("adam_step_cuda: launch failed: ") + cudaGetErrorString(e));
  return Status::Ok();
}

Status launch_all(const AdamHyper& h, const AdamRange* ranges, size_t count, cudaStream_t stream,
                  unsigned long long* d_nonfinite, int max_blocks, bool undo);

}  // namespace

Status adam_step_cuda(const AdamHyper& h, const AdamRange* ranges, size_t count, cudaStream_t stream,
                      unsigned long long* d_nonfinite) {
  if (count > 0 && !ranges) return Status::Invalid("adam_step_cuda: ranges is null");
  for (size_t i = 0; i < count; ++i) {
    const AdamRange& r = ranges[i];
    if (r.n == 0) continue;
    if (!r.grad || !r.master || !r.exp_avg || !r.exp_avg_sq)
      return Status::Invalid("adam_step_cuda: range " + std::to_string(i) + " has a null grad/master/exp_avg/exp_avg_sq");
    if (uint8_t(r.grad_dtype) > 2 || (r.param_out && uint8_t(r.param_dtype) > 2))
      return Status::Invalid("adam_step_cuda: range " + std::to_string(i) + " has an unknown dtype");
  }
  // One wave of resident blocks; they walk the rest of the tiles grid-stride.
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, adam_kernel, kThreads, 0);
  if (e != cudaSuccess) return Status::Runtime(std::string("adam_step_cuda: ") + cudaGetErrorString(e));
  const int max_blocks = sms * (per_sm > 0 ? per_sm : 1);

  if (h.undo) {  // the speculative step taken back first, in the same stream order
    AdamHyper made = h;
    made.grad_scale = h.undo_grad_scale;
    made.undo = false;
    ZOE_RETURN_IF_ERROR(launch_all(made, ranges, count, stream, nullptr, max_blocks, true));
    if (h.restore_only) return Status::Ok();
  }
  return launch_all(h, ranges, count, stream, d_nonfinite, max_blocks, false);
}

namespace {

// Every range of the call, kMaxRanges a launch.
Status launch_all(const AdamHyper& h, const AdamRange* ranges, size_t count, cudaStream_t stream,
                  unsigned long long* d_nonfinite, int max_blocks, bool undo) {
  LaunchArgs a{};
  a.c = adam_consts(h);
  a.undo = undo;
  a.first_step = h.step <= 1;
  for (size_t i = 0; i < count; ++i) {
    const AdamRange& r = ranges[i];
    if (r.n == 0) continue;
    if (a.count == kMaxRanges) {
      ZOE_RETURN_IF_ERROR(launch(a, max_blocks, stream, d_nonfinite));
      a.count = 0;
      a.total_tiles = 0;
    }
    RangeArg& ra = a.r[a.count++];
    ra = {r.grad, r.master, r.exp_avg, r.exp_avg_sq, r.param_out, r.n, a.total_tiles, uint8_t(r.grad_dtype),
          r.param_out ? uint8_t(r.param_dtype) : kNoCopy, 0};
    ra.vectorized = aligned16(r.grad) && aligned16(r.master) && aligned16(r.exp_avg) && aligned16(r.exp_avg_sq) &&
                    (!r.param_out || aligned16(r.param_out));
    a.total_tiles += (r.n + kTile - 1) / kTile;
  }
  return launch(a, max_blocks, stream, d_nonfinite);
}

}  // namespace
}  // namespace zoe::gpu

// Warp-wide bf16 tensor-core products (mma.sync m16n8k16, fp32 accumulation) and the fragment
// loads the attention's kernels use. Layouts are the PTX ISA's ("Matrix Fragments for
// mma.m16n8k16 with floating point type"); lane = 4 g + t (g = lane / 4, t = lane % 4):
//   A (16 x 16, row): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9],
//                     a[3] = A[g+8][2t+8, 2t+9] (two bf16 a register, the lower column low);
//   B (16 x 8, col):  b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
//   C, D (16 x 8):    c[0], c[1] = D[g][2t, 2t+1], c[2], c[3] = D[g+8][2t, 2t+1].
// Tiles live in shared memory as bf16 rows whose k index is contiguous: A's rows for A, B's
// columns (B^T's rows) for B, so every fragment element pair is one 32-bit load. On the CPU
// emulation (tools/cuda_emu) the instruction is a warp-wide call that checks every lane takes part.
#pragma once
#include <cstdint>

#include "gpu/cuda_kernel_util.cuh"

namespace zoe::gpu::kernels {

// d += A B for one warp (every lane calls, converged).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef ZOE_MMA_M16N8K16_BF16
  ZOE_MMA_M16N8K16_BF16(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();  // bf16 mma needs sm_80; the build targets 80 and 90 (CMakeLists.txt)
#endif
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) & 31; }

__device__ __forceinline__ uint32_t load_pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Two fp32 values rounded to bf16 (nearest, ties to even) in one register, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(bits::f32_to_bf16(lo)) | (static_cast<uint32_t>(bits::f32_to_bf16(hi)) << 16);
}

// A's fragment for rows r0..r0+15 and k0..k0+15 of a row-major bf16 tile (row stride ld, even).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* tile, int ld, int r0, int k0) {
  const int lane = lane_id(), g = lane >> 2, c = k0 + 2 * (lane & 3);
  const uint16_t* top = tile + (r0 + g) * ld + c;
  const uint16_t* bottom = top + 8 * ld;
  a[0] = load_pair(top);
  a[1] = load_pair(bottom);
  a[2] = load_pair(top + 8);
  a[3] = load_pair(bottom + 8);
}

// B's fragment for columns n0..n0+7 and k0..k0+15 where column n is row n of the tile:
// B[k][n] = tile[(n0 + n) * ld + k0 + k].
__device__ __forceinline__ void load_b(uint32_t (&b)[2], const uint16_t* tile, int ld, int n0, int k0) {
  const int lane = lane_id();
  const uint16_t* p = tile + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
  b[0] = load_pair(p);
  b[1] = load_pair(p + 8);
}

// The A fragment of columns 16 kk..16 kk+15 of a 16-row product held as accumulators, rounded to
// bf16: the accumulators of n-tiles 2 kk and 2 kk + 1 hold exactly those elements in this lane
// (the C layout's pairs are the A layout's), so no data moves between lanes.
__device__ __forceinline__ void acc_as_a(uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
  a[0] = pack_bf16(left[0], left[1]);
  a[1] = pack_bf16(left[2], left[3]);
  a[2] = pack_bf16(right[0], right[1]);
  a[3] = pack_bf16(right[2], right[3]);
}

}  // namespace zoe::gpu::kernels

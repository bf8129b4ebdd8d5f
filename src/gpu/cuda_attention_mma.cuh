// Causal self-attention on bf16 qkv [B,T,3C] with tensor cores (cuda_mma.cuh: mma.sync m16n8k16,
// bf16 operands, fp32 accumulation): FlashAttention-2's loop order in the same three kernels and
// with the same semantics as cuda_attention.cuh's fp32 kernels, which stay the reference (and the
// path for fp32 qkv). The forward keeps the log-sum-exp per query; the backward takes
// D = dout . out from attention_rowdot_kernel; each element of dqkv is accumulated by one thread
// in a fixed order (no atomics: deterministic).
//
// Rounded to bf16 besides q, k and v (bf16 already): the probabilities P before P v and P^T dout,
// dout, and dS before dS k and dS^T q, as FlashAttention does. Scores, the softmax statistics, D
// and every accumulator stay fp32.
//
// A block is 4 warps over a tile of 64 rows (queries in the forward and dq, keys in dkv); warp w
// owns rows 16 w..16 w+15 and holds their 16 x 64 scores as mma accumulators: a row's values lie
// in the 4 lanes of a quad (cuda_mma.cuh's layout), so its max and sum are two shuffles. The
// other side of each product (64 keys or queries) is in shared memory as bf16 tiles of HSP
// channels (the head size rounded up to 32, 64 or 128; padding rows and channels are zero),
// row-major and, where a product needs the channel index as its n, transposed.
#pragma once
#include <cstdint>

#include "gpu/cuda_attention.cuh"
#include "gpu/cuda_mma.cuh"

// Loops over a thread's accumulators unrolled, so that they stay in registers (nvcc left the
// 128-channel forward's in local memory without it).
#ifdef __CUDACC__
#define ZOE_UNROLL _Pragma("unroll")
#else
#define ZOE_UNROLL
#endif

namespace zoe::gpu::kernels {

constexpr int kMmaThreads = 128;          // 4 warps
constexpr int kMmaRows = 64;              // rows (queries or keys) of a tile
constexpr int kRowTiles8 = kMmaRows / 8;  // 8-wide n-tiles over a tile's rows
constexpr int kRowSteps = kMmaRows / 16;  // 16-deep k-steps over them

template <int HSP>
struct MmaTile {
  static constexpr int LD = HSP + 8;        // bf16 stride of a [64][HSP] tile: +16 bytes, so the
  static constexpr int LDT = kMmaRows + 8;  // 32 lanes' fragment loads hit 32 banks; [HSP][64] tiles
  static constexpr int kTile = kMmaRows * LD;
  static constexpr int kTileT = HSP * LDT;
  static constexpr int KD = HSP / 16;  // k-steps over the channels
  static constexpr int ND = HSP / 8;   // n-tiles over the channels
  static_assert(HSP % 32 == 0 && HSP <= 128, "padded head size is 32, 64 or 128");
};

__device__ __forceinline__ uint16_t bf16_of(uint16_t x) { return x; }
__device__ __forceinline__ uint16_t bf16_of(float x) { return bits::f32_to_bf16(x); }

// Rows [row0, row0 + 64) of one head (hs channels at src + row * ld, bf16, or fp32 rounded) into
// `rows` ([64][LD]) and/or `cols` ([HSP][LDT], transposed); rows >= T and channels >= hs are zero.
template <int HSP, class In>
__device__ __forceinline__ void load_tile(uint16_t* rows, uint16_t* cols, const In* src, int64_t ld, int row0, int T,
                                          int hs) {
  using G = MmaTile<HSP>;
  for (int e = threadIdx.x; e < kMmaRows * HSP; e += kMmaThreads) {
    const int r = e / HSP, d = e % HSP, row = row0 + r;
    const uint16_t v = (row < T && d < hs) ? bf16_of(src[static_cast<int64_t>(row) * ld + d]) : uint16_t{0};
    if (rows) rows[r * G::LD + d] = v;
    if (cols) cols[d * G::LDT + r] = v;
  }
}

// acc = the 16 x 64 products of rows r0..r0+15 of tile A with the 64 rows of tile Bt (both
// [64][LD]), over the channels.
template <int HSP>
__device__ __forceinline__ void tile_dots(float (&acc)[kRowTiles8][4], const uint16_t* A, int r0, const uint16_t* Bt) {
  using G = MmaTile<HSP>;
  ZOE_UNROLL
  for (int n = 0; n < kRowTiles8; n++)
    ZOE_UNROLL
    for (int i = 0; i < 4; i++) acc[n][i] = 0.f;
  ZOE_UNROLL
  for (int kd = 0; kd < G::KD; kd++) {
    uint32_t a[4];
    load_a(a, A, G::LD, r0, 16 * kd);
    ZOE_UNROLL
    for (int n = 0; n < kRowTiles8; n++) {
      uint32_t b[2];
      load_b(b, Bt, G::LD, 8 * n, 16 * kd);
      mma_bf16(acc[n], a, b);
    }
  }
}

// acc (16 x HSP) += W M: W the 16 x 64 weights held as accumulators (rounded to bf16 here), M the
// 64 x HSP tile stored transposed (cols, [HSP][LDT]).
template <int HSP>
__device__ __forceinline__ void weigh_rows(float (&acc)[MmaTile<HSP>::ND][4], const float (&w)[kRowTiles8][4],
                                           const uint16_t* cols) {
  using G = MmaTile<HSP>;
  ZOE_UNROLL
  for (int kk = 0; kk < kRowSteps; kk++) {
    uint32_t a[4];
    acc_as_a(a, w[2 * kk], w[2 * kk + 1]);
    ZOE_UNROLL
    for (int n = 0; n < G::ND; n++) {
      uint32_t b[2];
      load_b(b, cols, G::LDT, 8 * n, 16 * kk);
      mma_bf16(acc[n], a, b);
    }
  }
}

// The sum (or max) of a row's values over the 4 lanes of its quad; every lane of the warp calls.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

// Accumulator element i of n-tile n: its row (0..15 within the warp's rows) and column.
__device__ __forceinline__ int acc_row(int i) { return (lane_id() >> 2) + 8 * (i >> 1); }
__device__ __forceinline__ int acc_col(int n, int i) { return 8 * n + 2 * (lane_id() & 3) + (i & 1); }

// ---- forward ------------------------------------------------------------------------------------

// Block (x, b * NH + h): query tile qt = nt - 1 - x (the longest rows first). Per key tile kt <= qt
// the warp's scores, online softmax (earlier sums and outputs rescaled by exp(m_old - m_new); every
// row has an unmasked key in every tile it visits, key kt * 64 <= row, so m is finite from the
// first tile), then P v. l is this lane's share of its rows' sums until the end.
template <int HSP, class Out>
__global__ void __launch_bounds__(kMmaThreads)
    attention_forward_mma_kernel(Out* out, float* lse, const uint16_t* qkv, int T, int C, int NH, int hs,
                                 float scale) {
  using G = MmaTile<HSP>;
  ZOE_DYNAMIC_SMEM(smem);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);  // [64][LD]
  uint16_t* Ks = Qs + G::kTile;                      // [64][LD]
  uint16_t* Vt = Ks + G::kTile;                      // [HSP][LDT]
  const int nt = (T + kMmaRows - 1) / kMmaRows;
  const int qt = nt - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int r0 = 16 * (threadIdx.x / 32);
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const HeadOffsets off = head_offsets(b, h, T, C, hs);
  const uint16_t* q = qkv + off.qkv;
  const int q0 = qt * kMmaRows;
  load_tile<HSP>(Qs, nullptr, q, ld, q0, T, hs);

  float o[G::ND][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows acc_row(0) and acc_row(2)
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kMmaRows;
    __syncthreads();  // the last tile's Ks and Vt are read
    load_tile<HSP>(Ks, nullptr, q + C, ld, k0, T, hs);
    load_tile<HSP>(nullptr, Vt, q + 2 * C, ld, k0, T, hs);
    __syncthreads();
    float s[kRowTiles8][4];
    tile_dots<HSP>(s, Qs, r0, Ks);
    ZOE_UNROLL
    for (int half = 0; half < 2; half++) {
      const int row = q0 + r0 + acc_row(2 * half);
      float mx = -INFINITY;
      ZOE_UNROLL
      for (int n = 0; n < kRowTiles8; n++)
        ZOE_UNROLL
        for (int j = 0; j < 2; j++) {
          const int key = k0 + acc_col(n, j);
          float& v = s[n][2 * half + j];
          v = (key <= row && key < T) ? v * scale : -INFINITY;
          mx = fmaxf(mx, v);
        }
      const float m_new = fmaxf(m[half], quad_max(mx));
      const float alpha = expf(m[half] - m_new);  // 0 on the first tile (m = -inf)
      float sum = 0.f;
      ZOE_UNROLL
      for (int n = 0; n < kRowTiles8; n++)
        ZOE_UNROLL
        for (int j = 0; j < 2; j++) {
          float& v = s[n][2 * half + j];
          v = expf(v - m_new);  // 0 where masked
          sum += v;
        }
      l[half] = l[half] * alpha + sum;
      m[half] = m_new;
      ZOE_UNROLL
      for (int n = 0; n < G::ND; n++) {
        o[n][2 * half] *= alpha;
        o[n][2 * half + 1] *= alpha;
      }
    }
    weigh_rows<HSP>(o, s, Vt);
  }
  ZOE_UNROLL
  for (int half = 0; half < 2; half++) {
    const float total = quad_sum(l[half]);
    const int row = q0 + r0 + acc_row(2 * half);
    if (row >= T) continue;
    const float inv = 1.f / total;
    Out* dst = out + off.io + static_cast<int64_t>(row) * C;
    ZOE_UNROLL
    for (int n = 0; n < G::ND; n++)
      ZOE_UNROLL
      for (int j = 0; j < 2; j++) {
        const int d = acc_col(n, j);
        if (d < hs) store_out(dst + d, o[n][2 * half + j] * inv);
      }
    if ((lane_id() & 3) == 0) lse[static_cast<int64_t>(bh) * T + row] = m[half] + logf(total);
  }
}

// ---- backward: dq -------------------------------------------------------------------------------

// Block (x, b * NH + h): query tile qt = nt - 1 - x. Per key tile kt <= qt: S = q k^T, dP = dout v^T,
// dS = P (dP - D), dq += dS k; dq is scaled once at the end.
template <int HSP>
__global__ void __launch_bounds__(kMmaThreads)
    attention_dq_mma_kernel(float* dqkv, const float* Dg, const float* dout, const uint16_t* qkv, const float* lse,
                            int T, int C, int NH, int hs, float scale) {
  using G = MmaTile<HSP>;
  ZOE_DYNAMIC_SMEM(smem);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);  // [64][LD]
  uint16_t* dOs = Qs + G::kTile;                     // [64][LD]
  uint16_t* Ks = dOs + G::kTile;                     // [64][LD]
  uint16_t* Vs = Ks + G::kTile;                      // [64][LD]
  uint16_t* Kt = Vs + G::kTile;                      // [HSP][LDT]
  const int nt = (T + kMmaRows - 1) / kMmaRows;
  const int qt = nt - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int r0 = 16 * (threadIdx.x / 32);
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const HeadOffsets off = head_offsets(b, h, T, C, hs);
  const uint16_t* q = qkv + off.qkv;
  const int q0 = qt * kMmaRows;
  load_tile<HSP>(Qs, nullptr, q, ld, q0, T, hs);
  load_tile<HSP>(dOs, nullptr, dout + off.io, C, q0, T, hs);
  float row_lse[2], D[2];
  ZOE_UNROLL
  for (int half = 0; half < 2; half++) {
    const int row = q0 + r0 + acc_row(2 * half);
    row_lse[half] = row < T ? lse[static_cast<int64_t>(bh) * T + row] : 0.f;
    D[half] = row < T ? Dg[static_cast<int64_t>(bh) * T + row] : 0.f;
  }

  float dq[G::ND][4] = {};
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * kMmaRows;
    __syncthreads();  // the last tile's Ks, Vs and Kt are read
    load_tile<HSP>(Ks, Kt, q + C, ld, k0, T, hs);
    load_tile<HSP>(Vs, nullptr, q + 2 * C, ld, k0, T, hs);
    __syncthreads();
    float s[kRowTiles8][4], dp[kRowTiles8][4];
    tile_dots<HSP>(s, Qs, r0, Ks);
    tile_dots<HSP>(dp, dOs, r0, Vs);
    ZOE_UNROLL
    for (int n = 0; n < kRowTiles8; n++)
      ZOE_UNROLL
      for (int i = 0; i < 4; i++) {
        const int row = q0 + r0 + acc_row(i), key = k0 + acc_col(n, i), half = i >> 1;
        s[n][i] = (key <= row && row < T) ? expf(s[n][i] * scale - row_lse[half]) * (dp[n][i] - D[half]) : 0.f;
      }
    weigh_rows<HSP>(dq, s, Kt);
  }
  ZOE_UNROLL
  for (int n = 0; n < G::ND; n++)
    ZOE_UNROLL
    for (int i = 0; i < 4; i++) {
      const int row = q0 + r0 + acc_row(i), d = acc_col(n, i);
      if (row < T && d < hs) dqkv[off.qkv + static_cast<int64_t>(row) * ld + d] += scale * dq[n][i];
    }
}

// ---- backward: dk, dv ---------------------------------------------------------------------------

// Block (kt, b * NH + h): key tile kt, its rows keys, so scores are computed transposed
// (S^T = k q^T, dP^T = v dout^T). Per query tile qt >= kt: dv += P^T dout, dk += dS^T q.
template <int HSP>
__global__ void __launch_bounds__(kMmaThreads)
    attention_dkv_mma_kernel(float* dqkv, const float* dout, const uint16_t* qkv, const float* lse, const float* Dg,
                             int T, int C, int NH, int hs, float scale) {
  using G = MmaTile<HSP>;
  ZOE_DYNAMIC_SMEM(smem);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);  // [64][LD]
  uint16_t* Vs = Ks + G::kTile;                      // [64][LD]
  uint16_t* Qs = Vs + G::kTile;                      // [64][LD]
  uint16_t* dOs = Qs + G::kTile;                     // [64][LD]
  uint16_t* Qt = dOs + G::kTile;                     // [HSP][LDT]
  uint16_t* dOt = Qt + G::kTileT;                    // [HSP][LDT]
  float* lse_s = reinterpret_cast<float*>(dOt + G::kTileT);  // [64] of the query tile
  float* D_s = lse_s + kMmaRows;                              // [64]
  const int nt = (T + kMmaRows - 1) / kMmaRows;
  const int kt = blockIdx.x;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int r0 = 16 * (threadIdx.x / 32);
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const HeadOffsets off = head_offsets(b, h, T, C, hs);
  const uint16_t* q = qkv + off.qkv;
  const int k0 = kt * kMmaRows;
  load_tile<HSP>(Ks, nullptr, q + C, ld, k0, T, hs);
  load_tile<HSP>(Vs, nullptr, q + 2 * C, ld, k0, T, hs);

  float dk[G::ND][4] = {}, dv[G::ND][4] = {};
  for (int qt = kt; qt < nt; qt++) {
    const int q0 = qt * kMmaRows;
    __syncthreads();  // the last query tile is read
    load_tile<HSP>(Qs, Qt, q, ld, q0, T, hs);
    load_tile<HSP>(dOs, dOt, dout + off.io, C, q0, T, hs);
    for (int e = threadIdx.x; e < kMmaRows; e += kMmaThreads) {
      const int row = q0 + e;
      lse_s[e] = row < T ? lse[static_cast<int64_t>(bh) * T + row] : 0.f;
      D_s[e] = row < T ? Dg[static_cast<int64_t>(bh) * T + row] : 0.f;
    }
    __syncthreads();
    float p[kRowTiles8][4], ds[kRowTiles8][4];
    tile_dots<HSP>(p, Ks, r0, Qs);   // S^T
    tile_dots<HSP>(ds, Vs, r0, dOs);  // dP^T
    ZOE_UNROLL
    for (int n = 0; n < kRowTiles8; n++)
      ZOE_UNROLL
      for (int i = 0; i < 4; i++) {
        const int key = k0 + r0 + acc_row(i), c = acc_col(n, i), row = q0 + c;
        const bool live = key <= row && row < T;
        p[n][i] = live ? expf(p[n][i] * scale - lse_s[c]) : 0.f;
        ds[n][i] = p[n][i] * (ds[n][i] - D_s[c]);
      }
    weigh_rows<HSP>(dv, p, dOt);
    weigh_rows<HSP>(dk, ds, Qt);
  }
  ZOE_UNROLL
  for (int n = 0; n < G::ND; n++)
    ZOE_UNROLL
    for (int i = 0; i < 4; i++) {
      const int key = k0 + r0 + acc_row(i), d = acc_col(n, i);
      if (key >= T || d >= hs) continue;
      float* dst = dqkv + off.qkv + static_cast<int64_t>(key) * ld;
      dst[C + d] += scale * dk[n][i];
      dst[2 * C + d] += dv[n][i];
    }
}

// Dynamic shared memory of each kernel, bytes.
template <int HSP>
struct MmaSmem {
  using G = MmaTile<HSP>;
  static constexpr size_t kForward = sizeof(uint16_t) * (2 * G::kTile + G::kTileT);
  static constexpr size_t kDq = sizeof(uint16_t) * (4 * G::kTile + G::kTileT);
  static constexpr size_t kDkv = sizeof(uint16_t) * (4 * G::kTile + 2 * G::kTileT) + sizeof(float) * 2 * kMmaRows;
};

}  // namespace zoe::gpu::kernels

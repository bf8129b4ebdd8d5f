// Causal self-attention on the packed qkv [B,T,3C], fused flash-style, fp32 (the semantics of
// ops/gpt2_ops_attention.cc: forward keeps only the log-sum-exp per query, backward rebuilds the
// probabilities from it; nothing of size T x T ever lives in global memory).
//
// Work is cut into square tiles of BT queries x BT keys. A block of 256 threads is a 16 x 16 grid
// (ty = threadIdx.x / 16, tx = threadIdx.x % 16); in any BT x BT tile of scores, thread (ty, tx)
// owns rows ty + 16 i and columns tx + 16 j (i, j < BT / 16), and in any BT x HSP tile of outputs,
// rows ty + 16 i and channels tx + 16 j (j < HSP / 16). The 16 threads of a row are one half of a
// warp, so row-wise max / sum are 4 shuffles. Tiles of q, k, v, dout sit in shared memory with
// rows padded to HSP + 1 floats (score tiles to BT + 1): the strided accesses below then hit 16
// different banks.
//
// qkv is fp32, or bf16 in bf16 compute (In = uint16_t), widened as its tiles are loaded; the
// arithmetic is fp32 either way.
// HSP is the head size rounded up to 32, 64 or 128 (the tiles are zero-padded): any hs <= 128.
// Query rows past T are zero-padded too; their results are never written.
//
// Kernels, one block per (tile, b * NH + h):
//   attention_forward_kernel   per query tile: online softmax over key tiles 0..qt -> out, lse.
//   attention_rowdot_kernel    per query row: D_i = dout_i . out_i, which is sum_j P_ij dP_ij
//                              (dP = dout . v, out = P v): the softmax gradient's row term, read
//                              by both kernels below (rebuilding it from P and dP took the dq
//                              kernel a whole extra pass over the key tiles).
//   attention_dq_kernel        per query tile: over key tiles, dS = P (dP - D), dq += scale * dS k.
//   attention_dkv_kernel       per key tile: over query tiles qt >= kt, dv += P^T dout and
//                              dk += dS^T (q * scale).
// Each element of dqkv is accumulated by exactly one thread, in a loop order fixed by the shapes:
// the backward is deterministic without atomics.
#pragma once
#include <cstdint>

#include "gpu/cuda_kernel_util.cuh"

namespace zoe::gpu::kernels {

constexpr int kAttnThreads = 256;

// Tile geometry for a padded head size HSP. BT = 32 for HSP = 128 keeps the backward's shared
// memory (4 row tiles + 2 score tiles) under the 163 KiB an sm_80 block may have.
template <int HSP>
struct AttnTile {
  static constexpr int BT = HSP <= 64 ? 64 : 32;  // queries (and keys) per tile
  static constexpr int R = BT / 16;               // tile rows (and columns) per thread
  static constexpr int DJ = HSP / 16;             // output channels per thread
  static constexpr int LD = HSP + 1;              // shared row stride of q/k/v/dout tiles
  static constexpr int LDP = BT + 1;              // shared row stride of score tiles
  static constexpr int kRowTile = BT * LD;        // floats of one q/k/v/dout tile
  static constexpr int kScoreTile = BT * LDP;     // floats of one score tile
  static constexpr int kForwardFloats = 3 * kRowTile + kScoreTile;
  static constexpr int kDqFloats = 4 * kRowTile + kScoreTile;
  static constexpr int kDkvFloats = 4 * kRowTile + 2 * kScoreTile + 2 * BT;
  static_assert(HSP % 32 == 0 && HSP <= 128, "padded head size is 32, 64 or 128");
};

// Rows [row0, row0 + BT) of one head (hs elements, fp32 or bf16, at src + row * ld) into a
// [BT][HSP + 1] fp32 tile, times k. Rows >= T and channels >= hs are zero. Consecutive threads
// read consecutive channels.
template <int HSP, class In>
__device__ __forceinline__ void load_rows(float* dst, const In* src, int64_t ld, int row0, int T, int hs, float k) {
  using G = AttnTile<HSP>;
  for (int e = threadIdx.x; e < G::BT * HSP; e += kAttnThreads) {
    const int r = e / HSP, d = e % HSP;
    const int row = row0 + r;
    dst[r * G::LD + d] = (row < T && d < hs) ? k * widen(src[static_cast<int64_t>(row) * ld + d]) : 0.f;
  }
}

// acc[i][j] += sum_d A[ty + 16i][d] * Bm[tx + 16j][d]: this thread's part of the BT x BT block of
// dot products of the rows of two [BT][HSP + 1] tiles (scores q.k, or dout.v).
template <int HSP>
__device__ __forceinline__ void dot_rows(float (&acc)[AttnTile<HSP>::R][AttnTile<HSP>::R], const float* A,
                                         const float* Bm) {
  using G = AttnTile<HSP>;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  for (int d = 0; d < HSP; d++) {
    float a[G::R], b[G::R];
    for (int i = 0; i < G::R; i++) a[i] = A[(ty + 16 * i) * G::LD + d];
    for (int j = 0; j < G::R; j++) b[j] = Bm[(tx + 16 * j) * G::LD + d];
    for (int i = 0; i < G::R; i++)
      for (int j = 0; j < G::R; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// acc[i][j] += sum_{c < BT} P[ty + 16i][c] * M[c][tx + 16j]: a [BT][BT + 1] score tile times a
// [BT][HSP + 1] row tile, this thread's rows and channels.
template <int HSP>
__device__ __forceinline__ void mul_rows(float (&acc)[AttnTile<HSP>::R][AttnTile<HSP>::DJ], const float* P,
                                         const float* M) {
  using G = AttnTile<HSP>;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  for (int c = 0; c < G::BT; c++) {
    float m[G::DJ];
    for (int j = 0; j < G::DJ; j++) m[j] = M[c * G::LD + tx + 16 * j];
    for (int i = 0; i < G::R; i++) {
      const float p = P[(ty + 16 * i) * G::LDP + c];
      for (int j = 0; j < G::DJ; j++) acc[i][j] = fmaf(p, m[j], acc[i][j]);
    }
  }
}

// Reductions over the 16 threads of a tile row (the lanes of one half-warp; xor offsets below 16
// stay inside it). All 32 lanes of the warp must call. Every lane gets the same bits.
__device__ __forceinline__ float row16_max(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ __forceinline__ float row16_sum(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Where head h of batch b starts in qkv [B,T,3C] (q; k is +C, v is +2C) and in out/dout [B,T,C].
struct HeadOffsets {
  int64_t qkv, io;
};
__device__ __forceinline__ HeadOffsets head_offsets(int b, int h, int T, int C, int hs) {
  return {static_cast<int64_t>(b) * T * 3 * C + static_cast<int64_t>(h) * hs,
          static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs};
}

// ---- forward ------------------------------------------------------------------------------------

// Block (x, b * NH + h) handles query tile qt = nt - 1 - x (the longest rows start first). For
// each key tile kt <= qt it computes the scores, updates each row's running max m and sum l
// (online softmax: earlier contributions are rescaled by exp(m_old - m_new)) and adds P v into the
// output registers. Every row of a tile sees at least one unmasked key in every key tile it visits
// (key kt * BT <= qt * BT <= row), so m is finite after the first tile and no exp(-inf + inf) occurs.
template <int HSP, class Out, class In>
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(Out* out, float* lse, const In* qkv, int T, int C, int NH, int hs, float scale) {
  using G = AttnTile<HSP>;
  ZOE_DYNAMIC_SMEM(smem);
  float* Qs = smem;              // [BT][LD]  q * scale
  float* Ks = Qs + G::kRowTile;  // [BT][LD]
  float* Vs = Ks + G::kRowTile;  // [BT][LD]
  float* Ps = Vs + G::kRowTile;  // [BT][LDP] probabilities (unnormalised) of this key tile
  const int nt = (T + G::BT - 1) / G::BT;
  const int qt = nt - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const HeadOffsets off = head_offsets(b, h, T, C, hs);
  const In* q = qkv + off.qkv;
  const int q0 = qt * G::BT;
  load_rows<HSP>(Qs, q, ld, q0, T, hs, scale);

  float o[G::R][G::DJ] = {};
  float m[G::R], l[G::R];
  for (int i = 0; i < G::R; i++) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * G::BT;
    load_rows<HSP>(Ks, q + C, ld, k0, T, hs, 1.f);
    load_rows<HSP>(Vs, q + 2 * C, ld, k0, T, hs, 1.f);
    __syncthreads();
    float s[G::R][G::R] = {};
    dot_rows<HSP>(s, Qs, Ks);
    for (int i = 0; i < G::R; i++) {
      const int row = q0 + ty + 16 * i;
      float mx = -INFINITY;
      for (int j = 0; j < G::R; j++) {
        const int key = k0 + tx + 16 * j;
        if (key <= row && key < T) mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], row16_max(mx));
      const float alpha = expf(m[i] - m_new);  // 0 on the first tile (m = -inf)
      float rs = 0.f;
      for (int j = 0; j < G::R; j++) {
        const int key = k0 + tx + 16 * j;
        const float p = (key <= row && key < T) ? expf(s[i][j] - m_new) : 0.f;
        Ps[(ty + 16 * i) * G::LDP + tx + 16 * j] = p;
        rs += p;
      }
      l[i] = l[i] * alpha + row16_sum(rs);
      m[i] = m_new;
      for (int j = 0; j < G::DJ; j++) o[i][j] *= alpha;
    }
    __syncthreads();  // Ps complete
    mul_rows<HSP>(o, Ps, Vs);
    __syncthreads();  // Ks, Vs, Ps free for the next tile
  }
  for (int i = 0; i < G::R; i++) {
    const int row = q0 + ty + 16 * i;
    if (row >= T) continue;
    const float inv = 1.f / l[i];
    Out* dst = out + off.io + static_cast<int64_t>(row) * C;
    for (int j = 0; j < G::DJ; j++) {
      const int d = tx + 16 * j;
      if (d < hs) store_out(dst + d, o[i][j] * inv);
    }
    if (tx == 0) lse[static_cast<int64_t>(bh) * T + row] = m[i] + logf(l[i]);
  }
}

// ---- backward: D, then dq -----------------------------------------------------------------------

// D[bh, t] = sum over the head's channels of dout[b, t] * out[b, t] (out fp32, or bf16 as the
// bf16 forward stored it), one thread per row, channels in order. With round_dout, dout as the
// tensor-core kernels take it (rounded to bf16): D then matches their dP, and dS = P (dP - D)
// sums to zero over a row as it should.
template <class Out>
__global__ void attention_rowdot_kernel(float* Dg, const float* dout, const Out* out, int B, int T, int C, int NH,
                                        int hs, bool round_dout) {
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  for (int64_t i = global_thread(); i < rows; i += grid_threads()) {
    const int64_t bh = i / T, t = i - bh * T, b = bh / NH, h = bh - b * NH;
    const int64_t at = (b * T + t) * C + h * hs;
    float acc = 0.f;
    for (int d = 0; d < hs; d++) {
      const float g = round_dout ? bits::bf16_to_f32(bits::f32_to_bf16(dout[at + d])) : dout[at + d];
      acc += g * widen(out[at + d]);
    }
    Dg[i] = acc;
  }
}

// Block (x, b * NH + h) handles query tile qt = nt - 1 - x, with D (attention_rowdot_kernel) for
// its rows; dqkv's q channels are accumulated.
template <int HSP, class In>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dq_kernel(float* dqkv, const float* Dg, const float* dout, const In* qkv, const float* lse, int T, int C,
                        int NH, int hs, float scale) {
  using G = AttnTile<HSP>;
  ZOE_DYNAMIC_SMEM(smem);
  float* Qs = smem;               // [BT][LD]  q * scale
  float* dOs = Qs + G::kRowTile;  // [BT][LD]
  float* Ks = dOs + G::kRowTile;  // [BT][LD]
  float* Vs = Ks + G::kRowTile;   // [BT][LD]
  float* dSs = Vs + G::kRowTile;  // [BT][LDP]
  const int nt = (T + G::BT - 1) / G::BT;
  const int qt = nt - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const HeadOffsets off = head_offsets(b, h, T, C, hs);
  const In* q = qkv + off.qkv;
  const int q0 = qt * G::BT;
  load_rows<HSP>(Qs, q, ld, q0, T, hs, scale);
  load_rows<HSP>(dOs, dout + off.io, C, q0, T, hs, 1.f);
  float row_lse[G::R], D[G::R];
  for (int i = 0; i < G::R; i++) {
    const int row = q0 + ty + 16 * i;
    row_lse[i] = row < T ? lse[static_cast<int64_t>(bh) * T + row] : 0.f;
    D[i] = row < T ? Dg[static_cast<int64_t>(bh) * T + row] : 0.f;
  }

  // dS = P (dP - D) into shared memory, dq += dS k.
  float dq[G::R][G::DJ] = {};
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * G::BT;
    load_rows<HSP>(Ks, q + C, ld, k0, T, hs, 1.f);
    load_rows<HSP>(Vs, q + 2 * C, ld, k0, T, hs, 1.f);
    __syncthreads();
    float s[G::R][G::R] = {}, dp[G::R][G::R] = {};
    dot_rows<HSP>(s, Qs, Ks);
    dot_rows<HSP>(dp, dOs, Vs);
    for (int i = 0; i < G::R; i++) {
      const int row = q0 + ty + 16 * i;
      for (int j = 0; j < G::R; j++) {
        const int key = k0 + tx + 16 * j;
        float ds = 0.f;
        if (key <= row && row < T) ds = expf(s[i][j] - row_lse[i]) * (dp[i][j] - D[i]);
        dSs[(ty + 16 * i) * G::LDP + tx + 16 * j] = ds;
      }
    }
    __syncthreads();  // dSs complete
    mul_rows<HSP>(dq, dSs, Ks);
    __syncthreads();  // Ks, Vs, dSs free
  }
  for (int i = 0; i < G::R; i++) {
    const int row = q0 + ty + 16 * i;
    if (row >= T) continue;
    float* dst = dqkv + off.qkv + static_cast<int64_t>(row) * ld;
    for (int j = 0; j < G::DJ; j++) {
      const int d = tx + 16 * j;
      if (d < hs) dst[d] += scale * dq[i][j];
    }
  }
}

// ---- backward: dk, dv ---------------------------------------------------------------------------

// Block (kt, b * NH + h) handles key tile kt; its rows are keys, so scores are computed
// transposed (k . q). Query tiles qt >= kt are visited in ascending order.
template <int HSP, class In>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dkv_kernel(float* dqkv, const float* dout, const In* qkv, const float* lse, const float* Dg, int T,
                         int C, int NH, int hs, float scale) {
  using G = AttnTile<HSP>;
  ZOE_DYNAMIC_SMEM(smem);
  float* Ks = smem;                 // [BT][LD]
  float* Vs = Ks + G::kRowTile;     // [BT][LD]
  float* Qs = Vs + G::kRowTile;     // [BT][LD]  q * scale
  float* dOs = Qs + G::kRowTile;    // [BT][LD]
  float* Ps = dOs + G::kRowTile;    // [BT][LDP] P^T: rows keys, columns queries
  float* dSs = Ps + G::kScoreTile;  // [BT][LDP] dS^T
  float* lse_s = dSs + G::kScoreTile;  // [BT] of the query tile
  float* D_s = lse_s + G::BT;          // [BT]
  const int nt = (T + G::BT - 1) / G::BT;
  const int kt = blockIdx.x;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const HeadOffsets off = head_offsets(b, h, T, C, hs);
  const In* q = qkv + off.qkv;
  const int k0 = kt * G::BT;
  load_rows<HSP>(Ks, q + C, ld, k0, T, hs, 1.f);
  load_rows<HSP>(Vs, q + 2 * C, ld, k0, T, hs, 1.f);

  float dk[G::R][G::DJ] = {}, dv[G::R][G::DJ] = {};
  for (int qt = kt; qt < nt; qt++) {
    const int q0 = qt * G::BT;
    load_rows<HSP>(Qs, q, ld, q0, T, hs, scale);
    load_rows<HSP>(dOs, dout + off.io, C, q0, T, hs, 1.f);
    for (int e = threadIdx.x; e < G::BT; e += kAttnThreads) {
      const int row = q0 + e;
      lse_s[e] = row < T ? lse[static_cast<int64_t>(bh) * T + row] : 0.f;
      D_s[e] = row < T ? Dg[static_cast<int64_t>(bh) * T + row] : 0.f;
    }
    __syncthreads();
    float s[G::R][G::R] = {}, dp[G::R][G::R] = {};
    dot_rows<HSP>(s, Ks, Qs);   // s[i][j] = q_j . k_i (q scaled)
    dot_rows<HSP>(dp, Vs, dOs);  // dp[i][j] = dout_j . v_i
    for (int i = 0; i < G::R; i++) {
      const int key = k0 + ty + 16 * i;
      for (int j = 0; j < G::R; j++) {
        const int c = tx + 16 * j;
        const int row = q0 + c;
        float p = 0.f, ds = 0.f;
        if (key <= row && row < T) {
          p = expf(s[i][j] - lse_s[c]);
          ds = p * (dp[i][j] - D_s[c]);
        }
        Ps[(ty + 16 * i) * G::LDP + c] = p;
        dSs[(ty + 16 * i) * G::LDP + c] = ds;
      }
    }
    __syncthreads();  // Ps, dSs complete
    mul_rows<HSP>(dv, Ps, dOs);
    mul_rows<HSP>(dk, dSs, Qs);  // Qs carries the scale
    __syncthreads();  // Qs, dOs, Ps, dSs, lse_s, D_s free
  }
  for (int i = 0; i < G::R; i++) {
    const int key = k0 + ty + 16 * i;
    if (key >= T) continue;
    float* dst = dqkv + off.qkv + static_cast<int64_t>(key) * ld;
    for (int j = 0; j < G::DJ; j++) {
      const int d = tx + 16 * j;
      if (d < hs) {
        dst[C + d] += dk[i][j];
        dst[2 * C + d] += dv[i][j];
      }
    }
  }
}

}  // namespace zoe::gpu::kernels

// Causal multi-head self-attention on the packed qkv [B,T,3C].
//
// One TBB task per (batch, head). Forward keeps only the log-sum-exp of each query row; backward
// rebuilds the attention probabilities from it (one extra q.k pass) instead of storing the
// B*NH*T*T matrix, which at T=1024 would dwarf every other activation.
// Queries go in tiles of 4 rows, keys in vectors of 8: every vector of K or V loaded from cache
// feeds 4 FMAs. The head's q, k, v are first copied into padded contiguous buffers (q scaled by
// 1/sqrt(hs), K and V also transposed) so that the tiles need no bounds checks.
#include <cmath>
#include <vector>

#include "common/round_up.h"
#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {

namespace {

using detail::load8;
using detail::store8;
using detail::v8f;
constexpr int kRows = 4;  // queries per tile

struct HeadDims {
  int T, hs;
  int hsp;   // hs rounded up to 8
  int Tq;    // T rounded up to kRows (rows of the query-side buffers)
  int Tk;    // T rounded up to 8 (columns of the transposed buffers)
  int64_t ld;  // 3C: row stride of qkv
  float scale;
  HeadDims(int T_, int C, int NH)
      : T(T_), hs(C / NH), hsp(round_up(hs, 8)), Tq(round_up(T_, kRows)), Tk(round_up(T_, 8)),
        ld(3 * int64_t{C}), scale(1.f / std::sqrt(static_cast<float>(hs))) {}
};

// S[r][j0, j0 + 8W) = sum_d A[r][d] * Bt[d][j] for the kRows rows of A: kRows x W vector
// accumulators, so that enough independent FMA chains are in flight.
template <int W>
ZOE_INLINE void tile_a_bt_cols(float* S, int lds, const float* A, int lda, const float* Bt, int ldb,
                               int hs, int j0) {
  v8f acc[kRows][W] = {};
  for (int d = 0; d < hs; d++) {
    v8f b[W];
    for (int w = 0; w < W; w++) b[w] = load8(Bt + int64_t{d} * ldb + j0 + 8 * w);
    for (int r = 0; r < kRows; r++) {
      const float a = A[r * lda + d];
      for (int w = 0; w < W; w++) acc[r][w] += a * b[w];
    }
  }
  for (int r = 0; r < kRows; r++)
    for (int w = 0; w < W; w++) store8(S + r * lds + j0 + 8 * w, acc[r][w]);
}

// S[r][j] = sum_d A[r][d] * Bt[d][j] for the kRows rows of A and j < n8 (a multiple of 8).
ZOE_INLINE void tile_a_bt(float* S, int lds, const float* A, int lda, const float* Bt, int ldb,
                          int hs, int n8) {
  int j = 0;
  for (; j + 16 <= n8; j += 16) tile_a_bt_cols<2>(S, lds, A, lda, Bt, ldb, hs, j);
  if (j < n8) tile_a_bt_cols<1>(S, lds, A, lda, Bt, ldb, hs, j);
}

// O[r][d0, d0 + 8W) += sum_{j<n} P[r][j] * M[j][d] for the kRows rows of P.
template <int W>
ZOE_INLINE void tile_p_m_cols(float* O, int ldo, const float* P, int ldp, const float* M, int ldm,
                              int n, int d0) {
  v8f acc[kRows][W];
  for (int r = 0; r < kRows; r++)
    for (int w = 0; w < W; w++) acc[r][w] = load8(O + r * ldo + d0 + 8 * w);
  for (int j = 0; j < n; j++) {
    v8f m[W];
    for (int w = 0; w < W; w++) m[w] = load8(M + int64_t{j} * ldm + d0 + 8 * w);
    for (int r = 0; r < kRows; r++) {
      const float p = P[r * ldp + j];
      for (int w = 0; w < W; w++) acc[r][w] += p * m[w];
    }
  }
  for (int r = 0; r < kRows; r++)
    for (int w = 0; w < W; w++) store8(O + r * ldo + d0 + 8 * w, acc[r][w]);
}

// O[r][0, hsp) += sum_{j<n} P[r][j] * M[j][0, hsp) for the kRows rows of P.
ZOE_INLINE void tile_p_m(float* O, int ldo, const float* P, int ldp, const float* M, int ldm, int n,
                         int hsp) {
  int d = 0;
  for (; d + 16 <= hsp; d += 16) tile_p_m_cols<2>(O, ldo, P, ldp, M, ldm, n, d);
  if (d < hsp) tile_p_m_cols<1>(O, ldo, P, ldp, M, ldm, n, d);
}

// D[j][0, hsp) += sum_r P[r][j] * A[r][0, hsp) for j < n: the transposed product, kRows rows.
ZOE_INLINE void tile_pt_a(float* D, int ldd, const float* P, int ldp, const float* A, int lda,
                          int n, int hsp) {
  for (int d = 0; d < hsp; d += 8) {
    const v8f a0 = load8(A + d), a1 = load8(A + lda + d), a2 = load8(A + 2 * lda + d),
              a3 = load8(A + 3 * lda + d);
    for (int j = 0; j < n; j++) {
      float* dj = D + int64_t{j} * ldd + d;
      store8(dj, load8(dj) + P[j] * a0 + P[ldp + j] * a1 + P[2 * ldp + j] * a2 +
                     P[3 * ldp + j] * a3);
    }
  }
}

// Copies T rows of hs floats (stride ld) into rows of `ldd` (row-major), times k, zero padded
// (the buffer is zeroed by the caller).
void gather_rows(float* dst, int ldd, const float* src, int64_t ld, int T, int hs, float k) {
  for (int i = 0; i < T; i++)
    for (int d = 0; d < hs; d++) dst[int64_t{i} * ldd + d] = k * src[i * ld + d];
}
// The same rows transposed: dst[d][i], rows of Tk.
void gather_cols(float* dst, int Tk, const float* src, int64_t ld, int T, int hs) {
  for (int i = 0; i < T; i++)
    for (int d = 0; d < hs; d++) dst[int64_t{d} * Tk + i] = src[i * ld + d];
}

}  // namespace

namespace {

// Scores of query i (row s of a tile, keys j < n) become probabilities over keys j <= i, zero
// for i < j < n; lse[i] is kept. Rows past T (tile padding) become all zero.
ZOE_INLINE void softmax_row(float* s, int i, int n, int T, float* lse) {
  if (i >= T) {
    std::fill(s, s + n, 0.f);
    return;
  }
  const float m = detail::max_of(s, i + 1);
  const float sum = detail::exp_shift_sum(s, s, m, i + 1);
  lse[i] = m + std::log(sum);
  const float inv = 1.f / sum;
  for (int j = 0; j <= i; j++) s[j] *= inv;
  std::fill(s + i + 1, s + n, 0.f);
}

// Forward of one head: out rows `ldo` apart; buf holds fwd_floats(h) floats.
int64_t fwd_floats(const HeadDims& h) {
  return int64_t{h.Tq} * h.hsp + int64_t{h.hs} * h.Tk + int64_t{h.T} * h.hsp + kRows * h.Tk +
         kRows * h.hsp;
}
ZOE_SIMD_CLONES void head_forward(float* out, int64_t ldo, float* lse, const float* qkv, int C,
                                  const HeadDims& h, float* buf) {
  const int hsp = h.hsp, Tk = h.Tk;
  float* Qs = buf;                         // [Tq][hsp]  q * scale
  float* Kt = Qs + int64_t{h.Tq} * hsp;    // [hs][Tk]
  float* V = Kt + int64_t{h.hs} * Tk;      // [T][hsp]
  float* S = V + int64_t{h.T} * hsp;       // [kRows][Tk]
  float* O = S + kRows * Tk;               // [kRows][hsp]
  std::fill(buf, O + kRows * hsp, 0.f);
  gather_rows(Qs, hsp, qkv, h.ld, h.T, h.hs, h.scale);
  gather_cols(Kt, Tk, qkv + C, h.ld, h.T, h.hs);
  gather_rows(V, hsp, qkv + 2 * C, h.ld, h.T, h.hs, 1.f);
  for (int i0 = 0; i0 < h.T; i0 += kRows) {
    const int n = std::min(i0 + kRows, h.T);  // keys any row of this tile sees
    tile_a_bt(S, Tk, Qs + int64_t{i0} * hsp, hsp, Kt, Tk, h.hs, round_up(n, 8));
    for (int r = 0; r < kRows; r++) softmax_row(S + r * Tk, i0 + r, n, h.T, lse);
    std::fill(O, O + kRows * hsp, 0.f);
    tile_p_m(O, hsp, S, Tk, V, hsp, n, hsp);
    for (int r = 0; r < kRows && i0 + r < h.T; r++)
      std::copy(O + r * hsp, O + r * hsp + h.hs, out + (i0 + r) * ldo);
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const HeadDims h(T, C, NH);
  detail::parallel_range(int64_t{B} * NH, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(fwd_floats(h));
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / NH, hh = t % NH;
      head_forward(out + b * T * C + hh * h.hs, C, lse + t * T, qkv + b * T * h.ld + hh * h.hs, C,
                   h, buf.data());
    }
  });
}

namespace {

// Backward of the softmax for query i: p holds its scores (keys j < n) and ds holds
// dp[j] = dout . v_j. On return p = probabilities, ds = p * (dp - sum_j p dp), the gradient of
// the scaled score; zero for j > i and for padding rows.
ZOE_INLINE void softmax_grad_row(float* p, float* ds, int i, int n, int T, const float* lse) {
  if (i >= T) {
    std::fill(p, p + n, 0.f);
    std::fill(ds, ds + n, 0.f);
    return;
  }
  detail::exp_shift_sum(p, p, lse[i], i + 1);
  float pdp = 0.f;
  for (int j = 0; j <= i; j++) pdp += p[j] * ds[j];
  for (int j = 0; j <= i; j++) ds[j] = p[j] * (ds[j] - pdp);
  std::fill(p + i + 1, p + n, 0.f);
  std::fill(ds + i + 1, ds + n, 0.f);
}

int64_t bwd_floats(const HeadDims& h) {
  return 2 * int64_t{h.Tq} * h.hsp + 2 * int64_t{h.hs} * h.Tk + 3 * int64_t{h.T} * h.hsp +
         2 * kRows * h.Tk + kRows * h.hsp;
}

// Scatter-adds rows of a padded [T][hsp] buffer into a head's rows of dqkv, times k.
void add_rows(float* dst, int64_t ld, const float* src, int hsp, int T, int hs, float k) {
  for (int i = 0; i < T; i++)
    for (int d = 0; d < hs; d++) dst[i * ld + d] += k * src[int64_t{i} * hsp + d];
}

// Backward of one head: dqkv rows += gradients; dout rows `ldo` apart; buf: bwd_floats(h).
ZOE_SIMD_CLONES void head_backward(float* dqkv, const float* dout, int64_t ldo, const float* qkv,
                                   const float* lse, int C, const HeadDims& h, float* buf) {
  const int hsp = h.hsp, Tk = h.Tk;
  const int64_t q_n = int64_t{h.Tq} * hsp, t_n = int64_t{h.hs} * Tk, k_n = int64_t{h.T} * hsp;
  float* Qs = buf;          // [Tq][hsp]  q * scale
  float* dO = Qs + q_n;     // [Tq][hsp]
  float* Kt = dO + q_n;     // [hs][Tk]
  float* Vt = Kt + t_n;     // [hs][Tk]
  float* K = Vt + t_n;      // [T][hsp]
  float* dK = K + k_n;      // [T][hsp]
  float* dV = dK + k_n;     // [T][hsp]
  float* P = dV + k_n;      // [kRows][Tk]
  float* dS = P + kRows * Tk;
  float* dQ = dS + kRows * Tk;  // [kRows][hsp]
  std::fill(buf, dQ + kRows * hsp, 0.f);
  gather_rows(Qs, hsp, qkv, h.ld, h.T, h.hs, h.scale);
  gather_rows(dO, hsp, dout, ldo, h.T, h.hs, 1.f);
  gather_cols(Kt, Tk, qkv + C, h.ld, h.T, h.hs);
  gather_cols(Vt, Tk, qkv + 2 * C, h.ld, h.T, h.hs);
  gather_rows(K, hsp, qkv + C, h.ld, h.T, h.hs, 1.f);
  for (int i0 = 0; i0 < h.T; i0 += kRows) {
    const int n = std::min(i0 + kRows, h.T), n8 = round_up(n, 8);
    tile_a_bt(P, Tk, Qs + int64_t{i0} * hsp, hsp, Kt, Tk, h.hs, n8);   // scaled scores
    tile_a_bt(dS, Tk, dO + int64_t{i0} * hsp, hsp, Vt, Tk, h.hs, n8);  // dout . v
    for (int r = 0; r < kRows; r++) softmax_grad_row(P + r * Tk, dS + r * Tk, i0 + r, n, h.T, lse);
    std::fill(dQ, dQ + kRows * hsp, 0.f);
    tile_p_m(dQ, hsp, dS, Tk, K, hsp, n, hsp);
    add_rows(dqkv + i0 * h.ld, h.ld, dQ, hsp, std::min(kRows, h.T - i0), h.hs, h.scale);
    tile_pt_a(dK, hsp, dS, Tk, Qs + int64_t{i0} * hsp, hsp, n, hsp);  // Qs carries the scale
    tile_pt_a(dV, hsp, P, Tk, dO + int64_t{i0} * hsp, hsp, n, hsp);
  }
  add_rows(dqkv + C, h.ld, dK, hsp, h.T, h.hs, 1.f);
  add_rows(dqkv + 2 * C, h.ld, dV, hsp, h.T, h.hs, 1.f);
}

}  // namespace

// Each (b, h) task writes only its own head's q, k, v channels of dqkv: no two tasks collide.
void attention_backward(float* dqkv, const float* dout, const float* /*out*/, const float* qkv, const float* lse,
                        int B, int T, int C, int NH) {
  const HeadDims h(T, C, NH);
  detail::parallel_range(int64_t{B} * NH, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(bwd_floats(h));
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / NH, hh = t % NH;
      const int64_t off = b * T * h.ld + hh * h.hs;
      head_backward(dqkv + off, dout + b * T * C + hh * h.hs, C, qkv + off, lse + t * T, C, h,
                    buf.data());
    }
  });
}

}  // namespace zoe::gpt2

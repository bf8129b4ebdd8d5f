// Causal multi-head self-attention on the packed qkv [B,T,3C].
//
// One TBB task per (batch, head). Forward keeps only the log-sum-exp of each query row; backward
// rebuilds the attention probabilities from it (one extra q.k pass) instead of storing the
// B*NH*T*T matrix, which at T=1024 would dwarf every other activation.
// The inner loops are axpys over contiguous memory so the compiler vectorizes them: scores run
// over keys using a transposed copy of K, the weighted sums run over channels.
#include <cmath>
#include <vector>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"

namespace zoe::gpt2 {

namespace {

// One head of one sequence inside qkv / out / dqkv: rows of q, k, v are `ld` floats apart.
struct Head {
  int T, hs;
  int64_t ld;  // 3C
  float scale;
};

// dst[d*T + j] = src[j*ld + d]: keys (or values) of the head as hs rows of length T.
void transpose_head(float* dst, const float* src, const Head& h) {
  for (int j = 0; j < h.T; j++)
    for (int d = 0; d < h.hs; d++) dst[int64_t{d} * h.T + j] = src[j * h.ld + d];
}

// s[j] = scale * q . k_j for keys j <= i, from the transposed keys Kt.
void causal_scores(float* __restrict s, const float* q, const float* __restrict Kt, int i,
                   const Head& h) {
  for (int j = 0; j <= i; j++) s[j] = 0.f;
  for (int d = 0; d < h.hs; d++) {
    const float qd = q[d] * h.scale;
    const float* __restrict kr = Kt + int64_t{d} * h.T;
    for (int j = 0; j <= i; j++) s[j] += qd * kr[j];
  }
}

void head_forward(float* out, int64_t ldo, float* lse, const float* qkv, int C, const Head& h,
                  float* Kt, float* s) {
  const float* q = qkv;
  const float* v = qkv + 2 * C;
  transpose_head(Kt, qkv + C, h);
  for (int i = 0; i < h.T; i++) {
    causal_scores(s, q + i * h.ld, Kt, i, h);
    float m = s[0];
    for (int j = 1; j <= i; j++) m = std::max(m, s[j]);
    float sum = 0.f;
    for (int j = 0; j <= i; j++) sum += (s[j] = std::exp(s[j] - m));
    lse[i] = m + std::log(sum);
    const float inv = 1.f / sum;
    float* __restrict o = out + i * ldo;
    for (int d = 0; d < h.hs; d++) o[d] = 0.f;
    for (int j = 0; j <= i; j++) {
      const float p = s[j] * inv;
      const float* __restrict vj = v + j * h.ld;
      for (int d = 0; d < h.hs; d++) o[d] += p * vj[d];
    }
  }
}

// p[j] (probabilities) and ds[j] (gradient of the scaled score, times scale) for query i.
void row_backward(float* p, float* ds, const float* q, const float* dout, float lse,
                  const float* Kt, const float* Vt, int i, const Head& h) {
  causal_scores(p, q, Kt, i, h);
  for (int j = 0; j <= i; j++) p[j] = std::exp(p[j] - lse);
  for (int j = 0; j <= i; j++) ds[j] = 0.f;  // dp[j] = dout . v_j first
  for (int d = 0; d < h.hs; d++) {
    const float g = dout[d];
    const float* __restrict vr = Vt + int64_t{d} * h.T;
    for (int j = 0; j <= i; j++) ds[j] += g * vr[j];
  }
  // softmax backward: ds = p * (dp - sum_j p dp)
  float pdp = 0.f;
  for (int j = 0; j <= i; j++) pdp += p[j] * ds[j];
  for (int j = 0; j <= i; j++) ds[j] = p[j] * (ds[j] - pdp) * h.scale;
}

void head_backward(float* dqkv, const float* dout, int64_t ldo, const float* qkv, const float* lse,
                   int C, const Head& h, float* Kt, float* Vt, float* p, float* ds) {
  transpose_head(Kt, qkv + C, h);
  transpose_head(Vt, qkv + 2 * C, h);
  for (int i = 0; i < h.T; i++) {
    const float* __restrict q = qkv + i * h.ld;
    const float* __restrict g = dout + i * ldo;
    row_backward(p, ds, q, g, lse[i], Kt, Vt, i, h);
    float* __restrict dq = dqkv + i * h.ld;
    for (int j = 0; j <= i; j++) {
      const float* __restrict kj = qkv + C + j * h.ld;
      float* __restrict dk = dqkv + C + j * h.ld;
      float* __restrict dv = dqkv + 2 * C + j * h.ld;
      for (int d = 0; d < h.hs; d++) {
        dq[d] += ds[j] * kj[d];
        dk[d] += ds[j] * q[d];
        dv[d] += p[j] * g[d];
      }
    }
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const Head h{T, hs, 3 * int64_t{C}, 1.f / std::sqrt(static_cast<float>(hs))};
  detail::parallel_range(int64_t{B} * NH, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(int64_t{hs} * T + T);
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / NH, hh = t % NH;
      head_forward(out + b * T * C + hh * hs, C, lse + t * T, qkv + b * T * 3 * C + hh * hs, C, h,
                   scratch.data(), scratch.data() + int64_t{hs} * T);
    }
  });
}

// Each (b, h) task writes only its own head's q, k, v channels of dqkv: no two tasks collide.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B,
                        int T, int C, int NH) {
  const int hs = C / NH;
  const Head h{T, hs, 3 * int64_t{C}, 1.f / std::sqrt(static_cast<float>(hs))};
  detail::parallel_range(int64_t{B} * NH, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(2 * int64_t{hs} * T + 2 * T);
    float* Kt = scratch.data();
    float* Vt = Kt + int64_t{hs} * T;
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / NH, hh = t % NH;
      const int64_t off3 = b * T * 3 * C + hh * hs;
      head_backward(dqkv + off3, dout + b * T * C + hh * hs, C, qkv + off3, lse + t * T, C, h, Kt,
                    Vt, Vt + int64_t{hs} * T, Vt + int64_t{hs} * T + T);
    }
  });
}

}  // namespace zoe::gpt2

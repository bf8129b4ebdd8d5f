// Causal self-attention for bf16 compute (as torch's CPU autocast runs scaled_dot_product_attention
// in bf16): the four products of the forward and the five of the backward are bf16 GEMMs on the
// model's GEMM path (fp32 accumulation: oneDNN's bf16 kernels where the CPU has bf16 units), the
// softmax, its gradient and the log-sum-exp stay fp32. Layout and rules are attention_forward's.
//
// The output is written rounded to bf16: only the projection after it reads it, as a bf16 operand.
// One oneTBB task per (batch, head), as the fp32 kernel. A head's q, k, v (and dout) are rounded
// into contiguous bf16 rows; queries then go in blocks of kQ rows, each against the keys before
// its end only: the products skip what the causal mask would zero, up to the block's diagonal.
#include <cmath>
#include <cstring>
#include <vector>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"
#include "zoe/dtype.h"

namespace zoe::gpt2 {

namespace {

constexpr int kQ = 64;  // queries per block
using detail::kNoTrans;
using detail::kTrans;

// A head's bf16 operands and the fp32 / bf16 planes of one query block.
struct HeadBuffers {
  std::vector<uint16_t> q, k, v, dout;  // [T][hs]
  std::vector<float> s, dp;             // [kQ][T]: scores / probabilities, dout . v
  std::vector<float> o;                 // [kQ][hs]: a block's output before its rounding
  std::vector<uint16_t> p16, ds16;      // [kQ][T]
  // This thread's buffers, grown to fit: no allocation or zeroing per task.
  static HeadBuffers& mine(int T, int hs) {
    thread_local HeadBuffers b;
    const size_t head = size_t(T) * hs, block = size_t(kQ) * T;
    auto grow = [](auto& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(b.q, head), grow(b.k, head), grow(b.v, head), grow(b.dout, head);
    grow(b.s, block), grow(b.dp, block), grow(b.p16, block), grow(b.ds16, block);
    grow(b.o, size_t(kQ) * hs);
    return b;
  }
};

// rows x hs floats with row stride ld, rounded into contiguous bf16 rows.
void round_rows(uint16_t* dst, const float* src, int64_t ld, int rows, int hs) {
  for (int i = 0; i < rows; i++) detail::round_range(dst + int64_t{i} * hs, src + i * ld, hs);
}

// Row i (query i0 + r) of a block: scores s[0, n) (raw q.k) become probabilities over keys
// j <= i, zero after; returns the log-sum-exp of the scaled scores.
ZOE_SIMD_CLONES float block_softmax_row(float* s, int i, int n, float scale) {
  for (int j = 0; j <= i; j++) s[j] *= scale;
  const float m = detail::max_of(s, i + 1);
  const float sum = detail::exp_shift_sum(s, s, m, i + 1);
  const float inv = 1.f / sum;
  for (int j = 0; j <= i; j++) s[j] *= inv;
  std::fill(s + i + 1, s + n, 0.f);
  return m + std::log(sum);
}

// The backward's row: p = e^(scale s - lse) and ds = scale p (dp - sum p dp) for j <= i, zero after.
ZOE_SIMD_CLONES void block_softmax_grad_row(float* p, float* dp, int i, int n, float scale, float lse) {
  for (int j = 0; j <= i; j++) p[j] *= scale;
  detail::exp_shift_sum(p, p, lse, i + 1);
  float pdp = 0.f;
  for (int j = 0; j <= i; j++) pdp += p[j] * dp[j];
  for (int j = 0; j <= i; j++) dp[j] = scale * p[j] * (dp[j] - pdp);
  std::fill(p + i + 1, p + n, 0.f);
  std::fill(dp + i + 1, dp + n, 0.f);
}

struct Head {
  int T, hs;
  int64_t ld;  // 3C
  float scale;
};

void bf16_head_forward(uint16_t* out, int64_t ldo, float* lse, const float* qkv, int C, const Head& h, HeadBuffers& b) {
  const int T = h.T, hs = h.hs;
  round_rows(b.q.data(), qkv, h.ld, T, hs);
  round_rows(b.k.data(), qkv + C, h.ld, T, hs);
  round_rows(b.v.data(), qkv + 2 * C, h.ld, T, hs);
  for (int i0 = 0; i0 < T; i0 += kQ) {
    const int rows = std::min(kQ, T - i0), n = i0 + rows;  // keys any row of the block sees
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, b.q.data() + int64_t{i0} * hs, hs, b.k.data(), hs, 0.f,
                  b.s.data(), T);
    for (int r = 0; r < rows; r++) {
      float* s = b.s.data() + int64_t{r} * T;
      lse[i0 + r] = block_softmax_row(s, i0 + r, n, h.scale);
      detail::round_range(b.p16.data() + int64_t{r} * T, s, n);
    }
    detail::bgemm(kNoTrans, kNoTrans, rows, hs, n, b.p16.data(), T, b.v.data(), hs, 0.f, b.o.data(), hs);
    for (int r = 0; r < rows; r++) detail::round_range(out + (i0 + r) * ldo, b.o.data() + int64_t{r} * hs, hs);
  }
}

void bf16_head_backward(float* dqkv, const float* dout, int64_t ldo, const float* qkv, const float* lse, int C,
                        const Head& h, HeadBuffers& b) {
  const int T = h.T, hs = h.hs, ld = int(h.ld);
  round_rows(b.q.data(), qkv, h.ld, T, hs);
  round_rows(b.k.data(), qkv + C, h.ld, T, hs);
  round_rows(b.v.data(), qkv + 2 * C, h.ld, T, hs);
  round_rows(b.dout.data(), dout, ldo, T, hs);
  for (int i0 = 0; i0 < T; i0 += kQ) {
    const int rows = std::min(kQ, T - i0), n = i0 + rows;
    const uint16_t* q = b.q.data() + int64_t{i0} * hs;
    const uint16_t* dO = b.dout.data() + int64_t{i0} * hs;
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, q, hs, b.k.data(), hs, 0.f, b.s.data(), T);
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, dO, hs, b.v.data(), hs, 0.f, b.dp.data(), T);
    for (int r = 0; r < rows; r++) {
      float* p = b.s.data() + int64_t{r} * T;
      float* ds = b.dp.data() + int64_t{r} * T;
      block_softmax_grad_row(p, ds, i0 + r, n, h.scale, lse[i0 + r]);
      detail::round_range(b.p16.data() + int64_t{r} * T, p, n);
      detail::round_range(b.ds16.data() + int64_t{r} * T, ds, n);
    }
    // dq[block] += ds k;  dk[0, n) += ds^T q[block];  dv[0, n) += p^T dout[block].
    detail::bgemm(kNoTrans, kNoTrans, rows, hs, n, b.ds16.data(), T, b.k.data(), hs, 1.f, dqkv + i0 * h.ld, ld);
    detail::bgemm(kTrans, kNoTrans, n, hs, rows, b.ds16.data(), T, q, hs, 1.f, dqkv + C, ld);
    detail::bgemm(kTrans, kNoTrans, n, hs, rows, b.p16.data(), T, dO, hs, 1.f, dqkv + 2 * C, ld);
  }
}

Head head_of(int T, int C, int NH) {
  const int hs = C / NH;
  return {T, hs, 3 * int64_t{C}, 1.f / std::sqrt(static_cast<float>(hs))};
}

}  // namespace

void attention_forward_bf16(uint16_t* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const Head h = head_of(T, C, NH);
  detail::parallel_range(int64_t{B} * NH, 1, [&](int64_t t0, int64_t t1) {
    HeadBuffers& buf = HeadBuffers::mine(T, h.hs);
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / NH, hh = t % NH;
      bf16_head_forward(out + b * T * C + hh * h.hs, C, lse + t * T, qkv + b * T * h.ld + hh * h.hs, C, h, buf);
    }
  });
}

// Each (b, h) task writes only its own head's q, k, v channels of dqkv: no two tasks collide.
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                             int NH) {
  const Head h = head_of(T, C, NH);
  detail::parallel_range(int64_t{B} * NH, 1, [&](int64_t t0, int64_t t1) {
    HeadBuffers& buf = HeadBuffers::mine(T, h.hs);
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / NH, hh = t % NH;
      const int64_t off = b * T * h.ld + hh * h.hs;
      bf16_head_backward(dqkv + off, dout + b * T * C + hh * h.hs, C, qkv + off, lse + t * T, C, h, buf);
    }
  });
}

}  // namespace zoe::gpt2

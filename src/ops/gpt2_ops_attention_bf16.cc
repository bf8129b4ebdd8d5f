// Causal self-attention for bf16 compute (as torch's CPU autocast runs scaled_dot_product_attention
// in bf16): the four products of the forward and the five of the backward are bf16 GEMMs on the
// model's GEMM path (fp32 accumulation: oneDNN's bf16 kernels where the CPU has bf16 units), the
// softmax, its gradient and the log-sum-exp stay fp32. Layout and rules are attention_forward's.
//
// qkv is bf16 (c_attn's product writes it so): the products read a head's q, k and v in place,
// rows 3C apart. The output is written rounded to bf16: only the projection after it reads it, as
// a bf16 operand. One oneTBB task per (batch, head), as the fp32 kernel. A head's dout is rounded
// into contiguous bf16 rows; queries go in blocks of kQ rows, each against the keys before its
// end only: the products skip what the causal mask would zero, up to the block's diagonal.
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"
#include "zoe/dtype.h"

namespace zoe::gpt2 {

namespace {

constexpr int kQ = 64;  // queries per block
using detail::kNoTrans;
using detail::kTrans;

// A head's rounded dout and the fp32 / bf16 planes of one query block.
struct HeadBuffers {
  std::vector<uint16_t> dout;           // [T][hs]
  std::vector<float> s, dp;             // [kQ][T]: scores, then their exponentials; dout . v
  std::vector<float> o;                 // [kQ][hs]: a block's output before its rounding
  std::vector<uint16_t> p16, ds16;      // [kQ][T]
  // This thread's buffers, grown to fit: no allocation or zeroing per task.
  static HeadBuffers& mine(int T, int hs) {
    thread_local HeadBuffers b;
    const size_t head = size_t(T) * hs, block = size_t(kQ) * T;
    auto grow = [](auto& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(b.dout, head);
    grow(b.s, block), grow(b.dp, block), grow(b.p16, block), grow(b.ds16, block);
    grow(b.o, size_t(kQ) * hs);
    return b;
  }
};

// rows x hs floats with row stride ld, rounded into contiguous bf16 rows.
void round_rows(uint16_t* dst, const float* src, int64_t ld, int rows, int hs) {
  for (int i = 0; i < rows; i++) detail::round_range(dst + int64_t{i} * hs, src + i * ld, hs);
}

using detail::exp8;
using detail::load8;
using detail::load8n;
using detail::store8;
using detail::store8n;
using detail::v8f;

// p16[0, len) = x * s rounded to bf16 (the rounding of round_range).
ZOE_INLINE void round_scaled(uint16_t* p16, const float* x, float s, int len) {
  int j = 0;
  for (; j + 8 <= len; j += 8) {
    const detail::v8h h = detail::bf16x8(load8(x + j) * s);
    std::memcpy(p16 + j, &h, sizeof h);
  }
  for (; j < len; j++) p16[j] = f32_to_bf16(x[j] * s);
}

// Row i (query i0 + r) of a block, one pass for the exponentials and one for the rounding: raw
// scores s[0, i] become e^(scale s - m) in place, p16[0, n) their normalised bf16, zero after i
// (the PV product reads n columns). Returns the log-sum-exp of the scaled scores.
ZOE_SIMD_CLONES float block_softmax_row(uint16_t* p16, float* s, int i, int n, float scale) {
  const int len = i + 1;
  const float m = detail::max_of(s, len) * scale;  // scale > 0: the max of the scaled scores
  v8f acc = {};
  int j = 0;
  for (; j + 8 <= len; j += 8) {
    const v8f e = exp8(load8(s + j) * scale - m);
    store8(s + j, e);
    acc += e;
  }
  if (j < len) {
    v8f e = exp8(load8n(s + j, len - j) * scale - m);
    for (int k = len - j; k < 8; k++) e[k] = 0.f;
    store8n(s + j, e, len - j);
    acc += e;
  }
  const float sum = detail::hsum(acc);
  round_scaled(p16, s, 1.f / sum, len);
  std::fill(p16 + len, p16 + n, uint16_t{0});
  return m + std::log(sum);
}

// The backward's row, in two passes: p = e^(scale s - lse) with sum p dp, then p16 = p and
// ds16 = scale p (dp - sum p dp) rounded, for j <= i; both zero after, up to n.
ZOE_SIMD_CLONES void block_softmax_grad_row(uint16_t* p16, uint16_t* ds16, float* p, const float* dp, int i, int n,
                                            float scale, float lse) {
  const int len = i + 1;
  v8f acc = {};
  int j = 0;
  for (; j + 8 <= len; j += 8) {
    const v8f e = exp8(load8(p + j) * scale - lse);
    store8(p + j, e);
    acc += e * load8(dp + j);
  }
  if (j < len) {  // dp's lanes past the row are zero, so are their products
    const v8f e = exp8(load8n(p + j, len - j) * scale - lse);
    store8n(p + j, e, len - j);
    acc += e * load8n(dp + j, len - j);
  }
  const float pdp = detail::hsum(acc);
  for (j = 0; j + 8 <= len; j += 8) {
    const v8f pv = load8(p + j);
    const detail::v8h h = detail::bf16x8(pv), d = detail::bf16x8(scale * pv * (load8(dp + j) - pdp));
    std::memcpy(p16 + j, &h, sizeof h);
    std::memcpy(ds16 + j, &d, sizeof d);
  }
  for (; j < len; j++) {
    p16[j] = f32_to_bf16(p[j]);
    ds16[j] = f32_to_bf16(scale * p[j] * (dp[j] - pdp));
  }
  std::fill(p16 + len, p16 + n, uint16_t{0});
  std::fill(ds16 + len, ds16 + n, uint16_t{0});
}

struct Head {
  int T, hs;
  int64_t ld;  // 3C
  float scale;
};

// qkv: the head's q in [B,T,3C] (k at +C, v at +2C), rows h.ld apart.
void bf16_head_forward(uint16_t* out, int64_t ldo, float* lse, const uint16_t* qkv, int C, const Head& h,
                       HeadBuffers& b) {
  const int T = h.T, hs = h.hs, ld = int(h.ld);
  const uint16_t *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
  for (int i0 = 0; i0 < T; i0 += kQ) {
    const int rows = std::min(kQ, T - i0), n = i0 + rows;  // keys any row of the block sees
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, q + i0 * h.ld, ld, k, ld, 0.f, b.s.data(), T);
    for (int r = 0; r < rows; r++)
      lse[i0 + r] = block_softmax_row(b.p16.data() + int64_t{r} * T, b.s.data() + int64_t{r} * T, i0 + r, n, h.scale);
    detail::bgemm(kNoTrans, kNoTrans, rows, hs, n, b.p16.data(), T, v, ld, 0.f, b.o.data(), hs);
    for (int r = 0; r < rows; r++) detail::round_range(out + (i0 + r) * ldo, b.o.data() + int64_t{r} * hs, hs);
  }
}

void bf16_head_backward(float* dqkv, const float* dout, int64_t ldo, const uint16_t* qkv, const float* lse, int C,
                        const Head& h, HeadBuffers& b) {
  const int T = h.T, hs = h.hs, ld = int(h.ld);
  const uint16_t *k = qkv + C, *v = qkv + 2 * C;
  round_rows(b.dout.data(), dout, ldo, T, hs);
  for (int i0 = 0; i0 < T; i0 += kQ) {
    const int rows = std::min(kQ, T - i0), n = i0 + rows;
    const uint16_t* q = qkv + i0 * h.ld;
    const uint16_t* dO = b.dout.data() + int64_t{i0} * hs;
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, q, ld, k, ld, 0.f, b.s.data(), T);
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, dO, hs, v, ld, 0.f, b.dp.data(), T);
    for (int r = 0; r < rows; r++) {
      const int64_t at = int64_t{r} * T;
      block_softmax_grad_row(b.p16.data() + at, b.ds16.data() + at, b.s.data() + at, b.dp.data() + at, i0 + r, n,
                             h.scale, lse[i0 + r]);
    }
    // dq[block] += ds k;  dk[0, n) += ds^T q[block];  dv[0, n) += p^T dout[block].
    detail::bgemm(kNoTrans, kNoTrans, rows, hs, n, b.ds16.data(), T, k, ld, 1.f, dqkv + i0 * h.ld, ld);
    detail::bgemm(kTrans, kNoTrans, n, hs, rows, b.ds16.data(), T, q, ld, 1.f, dqkv + C, ld);
    detail::bgemm(kTrans, kNoTrans, n, hs, rows, b.p16.data(), T, dO, hs, 1.f, dqkv + 2 * C, ld);
  }
}

Head head_of(int T, int C, int NH) {
  const int hs = C / NH;
  return {T, hs, 3 * int64_t{C}, 1.f / std::sqrt(static_cast<float>(hs))};
}

}  // namespace

void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH) {
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
void attention_backward_bf16(float* dqkv, const float* dout, const uint16_t* qkv, const float* lse, int B, int T,
                             int C, int NH) {
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

// Causal self-attention for bf16 compute (as torch's CPU autocast runs scaled_dot_product_attention
// in bf16): the four products of the forward and the five of the backward are bf16 GEMMs on the
// model's GEMM path (fp32 accumulation: oneDNN's bf16 kernels where the CPU has bf16 units), the
// softmax, its gradient and the log-sum-exp stay fp32. Layout and rules are attention_forward's.
//
// qkv is bf16 (c_attn's product writes it so). A head's q, k and v are copied out of it into
// dense [T][hs] rows first, and every product of a block reads and writes dense operands (leading
// dimension = width): oneDNN 2.6's kernels for these small shapes ran 1.7-4x slower on operands
// rows 3C apart or on a block's scores at T-wide rows (64 x 256 x 64: 13.3 us strided, 5.4 dense;
// 64 x 64 x 64: 4.0 against 1.0; bench/history.md, issue 51). The backward writes each head's dq,
// dk, dv into dqkv once, rounded from dense fp32 sums. The output is written rounded to bf16: only the
// projection after it reads it, as a bf16 operand; so is dqkv, which only c_attn's backward reads,
// with c_attn's bias gradient summed beside it. One oneTBB task per (batch, head), as the fp32
// kernel. Queries go in blocks of kQ rows, each against the keys before its end only: the products
// skip what the causal mask would zero, up to the block's diagonal.
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

// A head's dense operands and the fp32 / bf16 planes of one query block (rows n wide, n the keys
// the block sees).
struct HeadBuffers {
  std::vector<uint16_t> q, k, v, dout;  // [T][hs]: the head's q, k, v; its rounded dout
  std::vector<float> dq, dk, dv;        // [T][hs]: the head's gradients, summed over its blocks
  std::vector<float> s, dp;             // [kQ][n]: scores, then their exponentials; dout . v
  std::vector<float> o;                 // [kQ][hs]: a block's output before its rounding
  std::vector<uint16_t> p16, ds16;      // [kQ][n]
  // This thread's buffers, grown to fit: no allocation per task.
  static HeadBuffers& mine(int T, int hs) {
    thread_local HeadBuffers b;
    const size_t head = size_t(T) * hs, block = size_t(kQ) * T;
    auto grow = [](auto& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(b.q, head), grow(b.k, head), grow(b.v, head), grow(b.dout, head);
    grow(b.dq, head), grow(b.dk, head), grow(b.dv, head);
    grow(b.s, block), grow(b.dp, block), grow(b.p16, block), grow(b.ds16, block);
    grow(b.o, size_t(kQ) * hs);
    return b;
  }
};

// rows x hs bf16 with row stride ld, copied into dense rows: in 32-byte pieces where hs allows
// (moves the compiler inlines; a call to memcpy for each 128-byte row was 2 % of the step).
void copy_rows(uint16_t* dst, const uint16_t* src, int64_t ld, int rows, int hs) {
  if (hs % 16 == 0) {
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < hs; j += 16) std::memcpy(dst + int64_t{i} * hs + j, src + i * ld + j, 32);
    return;
  }
  for (int i = 0; i < rows; i++) std::memcpy(dst + int64_t{i} * hs, src + i * ld, sizeof(uint16_t) * hs);
}

// rows x hs floats with row stride ld, rounded into contiguous bf16 rows.
void round_rows(uint16_t* dst, const float* src, int64_t ld, int rows, int hs) {
  for (int i = 0; i < rows; i++) detail::round_range(dst + int64_t{i} * hs, src + i * ld, hs);
}

using detail::exp8;
using detail::load8;
using detail::load8n;
using detail::store8;
using detail::store8n;
using detail::v16f;
using detail::v8f;

// Lanes j.. of a row of len values: the first min(8, len - j) kept, the others zero.
ZOE_INLINE v8f keep_row(v8f x, int j, int len) {
  const detail::v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  return lane < len - j ? x : v8f{};
}

// A row's tail, lanes j.. past its end (len) zeroed: 8 lanes at once where the row's n columns
// hold them (every block but a last one of T % 8 != 0 keys), else the lanes that are there. A
// call to memcpy for each row's tail cost 5 % of the attention.
ZOE_INLINE v8f load_tail(const float* x, int j, int len, int n) {
  return j + 8 <= n ? keep_row(load8(x + j), j, len) : keep_row(load8n(x + j, n - j), j, len);
}
ZOE_INLINE void store_tail(float* x, v8f v, int j, int n) {
  if (j + 8 <= n) store8(x + j, v);
  else store8n(x + j, v, n - j);
}
ZOE_INLINE void store_tail(uint16_t* x, detail::v8h h, int j, int n) {
  std::memcpy(x + j, &h, sizeof(uint16_t) * size_t(std::min(8, n - j)));
}

// 16 lanes as bf16: two bf16x8 halves into dst[0, 16).
ZOE_INLINE void store_bf16x16(uint16_t* dst, v16f x) {
  const detail::v8h lo = detail::bf16x8(detail::lo8(x)), hi = detail::bf16x8(detail::hi8(x));
  std::memcpy(dst, &lo, sizeof lo);
  std::memcpy(dst + 8, &hi, sizeof hi);
}

// Row i (query i0 + r) of a block, one pass for the exponentials and one for the rounding: raw
// scores s[0, i] become e^(scale s - m) in place, p16[0, n) their normalised bf16, zero after i
// (the PV product reads n columns). Returns the log-sum-exp of the scaled scores. The main loops
// take 16 lanes (one AVX-512 register in the v4 clone), the rest 8: the same order on every ISA.
ZOE_SIMD_CLONES float block_softmax_row(uint16_t* p16, float* s, int i, int n, float scale) {
  const int len = i + 1;
  const float m = detail::max_of(s, len) * scale;  // scale > 0: the max of the scaled scores
  v16f acc16 = {};
  int j = 0;
  for (; j + 16 <= len; j += 16) {
    const v16f e = detail::exp16(detail::load16(s + j) * scale - m);
    detail::store16(s + j, e);
    acc16 += e;
  }
  v8f acc = detail::lo8(acc16) + detail::hi8(acc16);
  for (; j + 8 <= len; j += 8) {
    const v8f e = exp8(load8(s + j) * scale - m);
    store8(s + j, e);
    acc += e;
  }
  const int full = j;
  if (j < len) {
    const v8f e = keep_row(exp8(load_tail(s, j, len, n) * scale - m), j, len);
    store_tail(s, e, j, n);
    acc += e;
  }
  const float sum = detail::hsum(acc), inv = 1.f / sum;
  for (j = 0; j + 16 <= full; j += 16) store_bf16x16(p16 + j, detail::load16(s + j) * inv);
  for (; j < full; j += 8) {
    const detail::v8h h = detail::bf16x8(load8(s + j) * inv);
    std::memcpy(p16 + j, &h, sizeof h);
  }
  if (j < len) store_tail(p16, detail::bf16x8(keep_row(load_tail(s, j, len, n) * inv, j, len)), j, n), j += 8;
  if (j < n) std::fill(p16 + j, p16 + n, uint16_t{0});
  return m + std::log(sum);
}

// The backward's row, in two passes: p = e^(scale s - lse) with sum p dp, then p16 = p and
// ds16 = scale p (dp - sum p dp) rounded, for j <= i; both zero after, up to n.
ZOE_SIMD_CLONES void block_softmax_grad_row(uint16_t* p16, uint16_t* ds16, float* p, const float* dp, int i, int n,
                                            float scale, float lse) {
  const int len = i + 1;
  v16f acc16 = {};
  int j = 0;
  for (; j + 16 <= len; j += 16) {
    const v16f e = detail::exp16(detail::load16(p + j) * scale - lse);
    detail::store16(p + j, e);
    acc16 += e * detail::load16(dp + j);
  }
  v8f acc = detail::lo8(acc16) + detail::hi8(acc16);
  for (; j + 8 <= len; j += 8) {
    const v8f e = exp8(load8(p + j) * scale - lse);
    store8(p + j, e);
    acc += e * load8(dp + j);
  }
  const int full = j;
  if (j < len) {  // lanes past the row are zero in both factors
    const v8f e = keep_row(exp8(load_tail(p, j, len, n) * scale - lse), j, len);
    store_tail(p, e, j, n);
    acc += e * load_tail(dp, j, len, n);
  }
  const float pdp = detail::hsum(acc);
  for (j = 0; j + 16 <= full; j += 16) {
    const v16f pv = detail::load16(p + j);
    store_bf16x16(p16 + j, pv);
    store_bf16x16(ds16 + j, scale * pv * (detail::load16(dp + j) - pdp));
  }
  for (; j < full; j += 8) {
    const v8f pv = load8(p + j);
    const detail::v8h h = detail::bf16x8(pv), d = detail::bf16x8(scale * pv * (load8(dp + j) - pdp));
    std::memcpy(p16 + j, &h, sizeof h);
    std::memcpy(ds16 + j, &d, sizeof d);
  }
  if (j < len) {
    const v8f pv = load_tail(p, j, len, n);
    store_tail(p16, detail::bf16x8(pv), j, n);
    store_tail(ds16, detail::bf16x8(keep_row(scale * pv * (load_tail(dp, j, len, n) - pdp), j, len)), j, n);
    j += 8;
  }
  if (j < n) {
    std::fill(p16 + j, p16 + n, uint16_t{0});
    std::fill(ds16 + j, ds16 + n, uint16_t{0});
  }
}

struct Head {
  int T, hs;
  int64_t ld;  // 3C
  float scale;
};

// The head's q, k and v (in [B,T,3C], rows h.ld apart; k at +C, v at +2C) into b's dense rows.
void copy_head(HeadBuffers& b, const uint16_t* qkv, int C, const Head& h) {
  copy_rows(b.q.data(), qkv, h.ld, h.T, h.hs);
  copy_rows(b.k.data(), qkv + C, h.ld, h.T, h.hs);
  copy_rows(b.v.data(), qkv + 2 * C, h.ld, h.T, h.hs);
}

void bf16_head_forward(uint16_t* out, int64_t ldo, float* lse, const uint16_t* qkv, int C, const Head& h,
                       HeadBuffers& b) {
  const int T = h.T, hs = h.hs;
  copy_head(b, qkv, C, h);
  for (int i0 = 0; i0 < T; i0 += kQ) {
    const int rows = std::min(kQ, T - i0), n = i0 + rows;  // keys any row of the block sees
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, b.q.data() + int64_t{i0} * hs, hs, b.k.data(), hs, 0.f, b.s.data(), n);
    for (int r = 0; r < rows; r++)
      lse[i0 + r] = block_softmax_row(b.p16.data() + int64_t{r} * n, b.s.data() + int64_t{r} * n, i0 + r, n, h.scale);
    detail::bgemm(kNoTrans, kNoTrans, rows, hs, n, b.p16.data(), n, b.v.data(), hs, 0.f, b.o.data(), hs);
    for (int r = 0; r < rows; r++) detail::round_range(out + (i0 + r) * ldo, b.o.data() + int64_t{r} * hs, hs);
  }
}

// dst (rows h.ld apart) = src (dense [T][hs]) rounded, and sums[hs] (null: none) += src's
// column sums, rows in order.
void round_and_sum_rows(uint16_t* dst, float* sums, const float* src, const Head& h) {
  for (int t = 0; t < h.T; t++) {
    const float* x = src + int64_t{t} * h.hs;
    detail::round_range(dst + t * h.ld, x, h.hs);
    if (sums)
      for (int j = 0; j < h.hs; j++) sums[j] += x[j];
  }
}

// A head's part of dqkv, rounded, and of its batch's bias sums (sums: [3C] or null).
void bf16_head_backward(uint16_t* dqkv, float* sums, const float* dout, int64_t ldo, const uint16_t* qkv,
                        const float* lse, int C, const Head& h, HeadBuffers& b) {
  const int T = h.T, hs = h.hs;
  copy_head(b, qkv, C, h);
  round_rows(b.dout.data(), dout, ldo, T, hs);
  std::fill_n(b.dk.data(), size_t(T) * hs, 0.f);
  std::fill_n(b.dv.data(), size_t(T) * hs, 0.f);
  for (int i0 = 0; i0 < T; i0 += kQ) {
    const int rows = std::min(kQ, T - i0), n = i0 + rows;
    const uint16_t* q = b.q.data() + int64_t{i0} * hs;
    const uint16_t* dO = b.dout.data() + int64_t{i0} * hs;
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, q, hs, b.k.data(), hs, 0.f, b.s.data(), n);
    detail::bgemm(kNoTrans, kTrans, rows, n, hs, dO, hs, b.v.data(), hs, 0.f, b.dp.data(), n);
    for (int r = 0; r < rows; r++) {
      const int64_t at = int64_t{r} * n;
      block_softmax_grad_row(b.p16.data() + at, b.ds16.data() + at, b.s.data() + at, b.dp.data() + at, i0 + r, n,
                             h.scale, lse[i0 + r]);
    }
    // dq[block] = ds k (its rows come from this block alone);  dk[0, n) += ds^T q[block];
    // dv[0, n) += p^T dout[block].
    detail::bgemm(kNoTrans, kNoTrans, rows, hs, n, b.ds16.data(), n, b.k.data(), hs, 0.f,
                  b.dq.data() + int64_t{i0} * hs, hs);
    detail::bgemm(kTrans, kNoTrans, n, hs, rows, b.ds16.data(), n, q, hs, 1.f, b.dk.data(), hs);
    detail::bgemm(kTrans, kNoTrans, n, hs, rows, b.p16.data(), n, dO, hs, 1.f, b.dv.data(), hs);
  }
  round_and_sum_rows(dqkv, sums, b.dq.data(), h);
  round_and_sum_rows(dqkv + C, sums ? sums + C : nullptr, b.dk.data(), h);
  round_and_sum_rows(dqkv + 2 * C, sums ? sums + 2 * C : nullptr, b.dv.data(), h);
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

// Each (b, h) task writes only its own head's q, k, v channels of dqkv and of its batch's sums:
// no two tasks collide. The batches' sums are then added in batch order.
void attention_backward_bf16(uint16_t* dqkv, float* dbias, const float* dout, const uint16_t* /*out*/,
                             const uint16_t* qkv, const float* lse, int B, int T, int C, int NH, bool overwrite) {
  const Head h = head_of(T, C, NH);
  std::vector<float> sums(dbias ? size_t(B) * 3 * C : 0);  // zeroed
  detail::parallel_range(int64_t{B} * NH, 1, [&](int64_t t0, int64_t t1) {
    HeadBuffers& buf = HeadBuffers::mine(T, h.hs);
    for (int64_t t = t0; t < t1; t++) {
      const int64_t b = t / NH, hh = t % NH;
      const int64_t off = b * T * h.ld + hh * h.hs;
      float* s = dbias ? sums.data() + b * 3 * C + hh * h.hs : nullptr;
      bf16_head_backward(dqkv + off, s, dout + b * T * C + hh * h.hs, C, qkv + off, lse + t * T, C, h, buf);
    }
  });
  if (!dbias) return;
  for (int64_t c = 0; c < 3 * int64_t{C}; c++) {
    float s = 0.f;
    for (int64_t b = 0; b < B; b++) s += sums[b * 3 * C + c];
    dbias[c] = overwrite ? s : dbias[c] + s;
  }
}

}  // namespace zoe::gpt2

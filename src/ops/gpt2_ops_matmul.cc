// Linear layers (HF Conv1D layout W [C, OC]) and the tied LM head, through kernels/gemm.h.
#include <cstdio>
#include <cstring>
#include <mutex>

#include <tbb/task_arena.h>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"
#include "kernels/gemm.h"
#include "zoe/dtype.h"

namespace zoe::gpt2 {

namespace {

// The path this process takes for t (kernels/gemm.h: bf16 through oneDNN where the CPU has bf16
// units, else OpenBLAS on widened operands). A bad ZOE_GEMM_F32 / ZOE_GEMM_BF16 is reported where
// the device is made (make_backend); here it falls back to OpenBLAS.
GemmPath path(GemmType t) {
  auto pick = [](GemmType t) {
    auto r = gemm_path(t);
    return r.ok() ? *r : GemmPath::kOpenBlas;
  };
  if (t == GemmType::kF32) {
    static const GemmPath f32 = pick(t);
    return f32;
  }
  static const GemmPath bf16 = pick(t);
  return bf16;
}

// A path that failed (oneDNN out of memory) has left its slices to OpenBLAS: said once.
void warn_fallback(const Status& st) {
  static std::once_flag told;
  std::call_once(told, [&] { std::fprintf(stderr, "zoe: warning: %s; that product used OpenBLAS\n", st.message().c_str()); });
}

// A product in slices over oneTBB's workers (kernels/gemm.h).
void product(GemmType t, bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
             float beta, float* C, int ldc, const float* bias = nullptr) {
  Status st = gemm_sliced(path(t), t, GemmShape{ta, tb, M, N, K, lda, ldb, ldc}, A, B, beta, C, bias);
  if (!st.ok()) warn_fallback(st);
}

void sgemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float beta,
           float* C, int ldc) {
  product(GemmType::kF32, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

using detail::kNoTrans;
using detail::kTrans;
using detail::bgemm;

}  // namespace

// The bias goes in with the product (kernels/gemm.h: oneDNN's bias argument, or each slice of out
// seeded with it before the product adds onto it): one pass less over out.
void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                    int OC) {
  product(GemmType::kF32, kNoTrans, kNoTrans, N, OC, C, inp, C, W, OC, 0.f, out, OC, bias);
}

// Rows of dout, columns [o0, o1): dbias[o] += dout[r][o] (rows in order) where dbias is given,
// and the slice rounded into dout16 where that is given: one pass over dout for both.
ZOE_SIMD_CLONES static void bias_cols(float* dbias, uint16_t* dout16, const float* dout, int N, int OC, int64_t o0,
                                      int64_t o1) {
  for (int64_t r = 0; r < N; r++) {
    const float* d = dout + r * OC;
    if (dout16) detail::round_range(dout16 + r * OC + o0, d + o0, o1 - o0);
    if (dbias)
      for (int64_t o = o0; o < o1; o++) dbias[o] += d[o];
  }
}

// dbias[OC] += sum over rows of dout (and, bf16 compute, dout16 = dout rounded, in the same
// pass); tasks own column slices and add rows in order, so the sum does not depend on the
// slices, nor on whether dout is rounded too. One slice per worker: a task walks every row, and
// 128-column slices (512 B of each 1.5-6 KB row) ran at 0.6 of this (bench/history.md, issue 51).
static void bias_backward(float* dbias, const float* dout, int N, int OC, uint16_t* dout16 = nullptr) {
  const int64_t workers = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t width = std::max<int64_t>(128, (OC + workers - 1) / workers);
  detail::parallel_range(OC, width, [&](int64_t o0, int64_t o1) { bias_cols(dbias, dout16, dout, N, OC, o0, o1); });
}

void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp,
                     const float* W, int N, int C, int OC, bool overwrite) {
  if (dinp)
    sgemm(kNoTrans, kTrans, N, C, OC, dout, OC, W, OC, overwrite ? 0.f : 1.f, dinp, C);
  if (dW)
    sgemm(kTrans, kNoTrans, C, OC, N, inp, C, dout, OC, overwrite ? 0.f : 1.f, dW, OC);
  if (dbias && overwrite) std::fill(dbias, dbias + OC, 0.f);
  if (dbias) bias_backward(dbias, dout, N, OC);
}

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) {
  sgemm(kNoTrans, kTrans, N, V, C, inp, C, wte, C, 0.f, logits, V);
}

void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                      const float* wte, int N, int C, int V) {
  if (dinp)
    sgemm(kNoTrans, kNoTrans, N, C, V, dlogits, V, wte, C, 1.f, dinp, C);
  if (dwte)
    sgemm(kTrans, kNoTrans, V, C, N, dlogits, V, inp, C, 1.f, dwte, C);
}

namespace detail {

void bgemm(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B, int ldb,
           float beta, float* C, int ldc) {
  product(GemmType::kBF16, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

// 16 lanes a step, then 8 (the attention rounds 64-float rows, thousands a step), then one by one.
ZOE_SIMD_CLONES void round_range(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const detail::v16h h = detail::bf16x16(detail::load16(src + i));
    std::memcpy(dst + i, &h, sizeof h);
  }
  for (; i + 8 <= n; i += 8) {
    const v8h h = bf16x8(load8(src + i));
    std::memcpy(dst + i, &h, sizeof h);
  }
  for (; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

}  // namespace detail

void round_to_bf16(uint16_t* dst, const float* src, int64_t n) {
  detail::parallel_range(n, 32768, [&](int64_t a, int64_t b) { detail::round_range(dst + a, src + a, b - a); });
}

// The bf16 functions mirror the fp32 ones above operand for operand. A linear layer's input is
// bf16 already (its producer wrote it rounded); dout is rounded into scratch, N*OC elements.
void matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                         int OC) {
  product(GemmType::kBF16, kNoTrans, kNoTrans, N, OC, C, inp, C, W, OC, 0.f, out, OC, bias);
}

// out rounded to bf16 by the product (kernels/gemm.h: oneDNN writes it so; other paths round).
static void product16(bool tb, int N, int OC, int C, const uint16_t* inp, const uint16_t* W, int ldw, uint16_t* out,
                      const float* bias) {
  Status st = gemm_sliced(path(GemmType::kBF16), GemmType::kBF16, GemmShape{kNoTrans, tb, N, OC, C, C, ldw, OC}, inp,
                          W, out, bias);
  if (!st.ok()) warn_fallback(st);
}

void matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                         int OC) {
  product16(kNoTrans, N, OC, C, inp, W, OC, out, bias);
}

void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout, const uint16_t* inp,
                          const uint16_t* W, int N, int C, int OC, uint16_t* scratch, bool overwrite) {
  uint16_t* dout16 = scratch;
  if (dbias && overwrite) std::fill(dbias, dbias + OC, 0.f);
  // dbias from the fp32 dout (no rounding where no product is), in the rounding's pass over it.
  if (dinp || dW || dbias) bias_backward(dbias, dout, N, OC, dinp || dW ? dout16 : nullptr);
  matmul_backward_bf16(dinp, dW, dout16, inp, W, N, C, OC, overwrite);
}

void matmul_backward_bf16(float* dinp, float* dW, const uint16_t* dout, const uint16_t* inp, const uint16_t* W, int N,
                          int C, int OC, bool overwrite) {
  if (dinp) bgemm(kNoTrans, kTrans, N, C, OC, dout, OC, W, OC, overwrite ? 0.f : 1.f, dinp, C);
  if (dW) bgemm(kTrans, kNoTrans, C, OC, N, inp, C, dout, OC, overwrite ? 0.f : 1.f, dW, OC);
}

// The CPU has no product epilogue to run GELU in: the two ops, one after the other.
void matmul_gelu_forward_bf16(uint16_t* out, uint16_t* pre, const uint16_t* inp, const uint16_t* W, const float* bias,
                              int N, int C, int OC) {
  matmul_forward_bf16(pre, inp, W, bias, N, C, OC);
  gelu_forward_bf16(out, pre, int64_t{N} * OC);
}

void matmul_gelu_backward_bf16(uint16_t* dpre, float* dbias_pre, float* dW, const uint16_t* dout, const uint16_t* inp,
                               const uint16_t* W, const uint16_t* pre, int N, int C, int OC, float* scratch) {
  matmul_backward_bf16(scratch, dW, dout, inp, W, N, C, OC, /*overwrite=*/true);
  gelu_backward_bf16(dpre, dbias_pre, pre, scratch, N, C, /*overwrite=*/true);
}

// The LM head in bf16 compute: its input, logits and dlogits are bf16 already (ln_f's LayerNorm
// and the loss wrote them so), so no operand is rounded here.
void lm_head_forward_bf16(uint16_t* logits, const uint16_t* inp, const uint16_t* wte, int N, int C, int V) {
  product16(kTrans, N, V, C, inp, wte, C, logits, nullptr);
}

void lm_head_backward_bf16(float* dinp, float* dwte, const uint16_t* dlogits, const uint16_t* inp,
                           const uint16_t* wte, int N, int C, int V) {
  if (dinp) bgemm(kNoTrans, kNoTrans, N, C, V, dlogits, V, wte, C, 1.f, dinp, C);
  if (dwte) bgemm(kTrans, kNoTrans, V, C, N, dlogits, V, inp, C, 1.f, dwte, C);
}

}  // namespace zoe::gpt2

// Linear layers (HF Conv1D layout W [C, OC]) and the tied LM head, through BLAS sgemm.
#include <cblas.h>

#include <algorithm>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"

namespace zoe::gpt2 {

namespace {

// The slices below are the parallelism: OpenBLAS runs each one on the thread that calls it. (Set
// at each product, on the model's thread: a trainer or bench may have set OpenBLAS's count since.)
void blas_single_threaded() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

// Row-major C[M, N] = op(A) op(B) + beta C, in slices that oneTBB's workers take as they come
// free, each a single-threaded sgemm. OpenBLAS's own threads would split the product once, in
// equal parts, and spin after it: where an I/O or optimizer thread takes a core for a while
// (offload on a few cores), one part waited for the other and the spinning took CPU from both.
// Slices are 256 columns, or 256 rows where C is taller than wide (the tied head's dwte is
// 50257 x 768); the choice depends on the shape alone, so results do not depend on the thread
// count: each element is one sgemm's dot product over all of K.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  constexpr int64_t kSlice = 256;
  blas_single_threaded();
  const bool by_rows = M > N;
  const int64_t extent = by_rows ? M : N;
  detail::parallel_range((extent + kSlice - 1) / kSlice, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t i0 = s * kSlice, n = std::min<int64_t>(extent - i0, kSlice);
      if (by_rows) {  // rows i0.. of op(A) and of C
        const float* As = ta == CblasTrans ? A + i0 : A + i0 * lda;
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(n), N, K, 1.f, As, lda, B, ldb, beta, C + i0 * ldc, ldc);
      } else {  // columns i0.. of op(B) and of C
        const float* Bs = tb == CblasTrans ? B + i0 * ldb : B + i0;
        cblas_sgemm(CblasRowMajor, ta, tb, M, static_cast<int>(n), K, 1.f, A, lda, Bs, ldb, beta, C + i0, ldc);
      }
    }
  });
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                    int OC) {
  // Seed out with the bias rows and let sgemm add onto them (beta = 1): one pass less over out.
  if (bias) {
    detail::parallel_range(N, detail::row_grain(OC), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++)
        for (int o = 0; o < OC; o++) out[r * OC + o] = bias[o];
    });
  }
  sgemm(CblasNoTrans, CblasNoTrans, N, OC, C, inp, C, W, OC, bias ? 1.f : 0.f, out, OC);
}

// dbias[OC] += sum over rows of dout; tasks own column slices and add rows in order, so the
// sum does not depend on the thread count.
static void bias_backward(float* dbias, const float* dout, int N, int OC) {
  detail::parallel_range(OC, 128, [&](int64_t o0, int64_t o1) {
    for (int64_t r = 0; r < N; r++) {
      const float* d = dout + r * OC;
      for (int64_t o = o0; o < o1; o++) dbias[o] += d[o];
    }
  });
}

void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp,
                     const float* W, int N, int C, int OC) {
  if (dinp)
    sgemm(CblasNoTrans, CblasTrans, N, C, OC, dout, OC, W, OC, 1.f, dinp, C);
  if (dW)
    sgemm(CblasTrans, CblasNoTrans, C, OC, N, inp, C, dout, OC, 1.f, dW, OC);
  if (dbias) bias_backward(dbias, dout, N, OC);
}

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) {
  sgemm(CblasNoTrans, CblasTrans, N, V, C, inp, C, wte, C, 0.f, logits, V);
}

void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                      const float* wte, int N, int C, int V) {
  if (dinp)
    sgemm(CblasNoTrans, CblasNoTrans, N, C, V, dlogits, V, wte, C, 1.f, dinp, C);
  if (dwte)
    sgemm(CblasTrans, CblasNoTrans, V, C, N, dlogits, V, inp, C, 1.f, dwte, C);
}

}  // namespace zoe::gpt2

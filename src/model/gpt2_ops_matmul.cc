// Linear layers (HF Conv1D layout W [C, OC]) and the tied LM head, through BLAS sgemm.
#include <cblas.h>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"

namespace zoe::gpt2 {

void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                    int OC) {
  // Seed out with the bias rows and let sgemm add onto them (beta = 1): one pass less over out.
  if (bias) {
    detail::parallel_range(N, detail::row_grain(OC), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++)
        for (int o = 0; o < OC; o++) out[r * OC + o] = bias[o];
    });
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.f, inp, C, W, OC,
              bias ? 1.f : 0.f, out, OC);
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.f, dout, OC, W, OC, 1.f,
                dinp, C);
  if (dW)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dW,
                OC);
  if (dbias) bias_backward(dbias, dout, N, OC);
}

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, C, 1.f, inp, C, wte, C, 0.f, logits,
              V);
}

void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                      const float* wte, int N, int C, int V) {
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.f, dlogits, V, wte, C, 1.f,
                dinp, C);
  if (dwte)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.f, dlogits, V, inp, C, 1.f,
                dwte, C);
}

}  // namespace zoe::gpt2

// Linear layers (HF Conv1D layout W [C, OC]) and the tied LM head, through kernels/gemm.h.
#include <cstdio>
#include <mutex>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"
#include "kernels/gemm.h"

namespace zoe::gpt2 {

namespace {

// The fp32 path of this process (kernels/gemm.h). A bad ZOE_GEMM_F32 is reported where the
// device is made (make_backend); here it falls back to OpenBLAS.
GemmPath f32_path() {
  static const GemmPath p = [] {
    auto r = gemm_path(GemmType::kF32);
    return r.ok() ? *r : GemmPath::kOpenBlas;
  }();
  return p;
}

// A product in slices over oneTBB's workers (kernels/gemm.h); a path that fails (oneDNN out of
// memory) has left its slices to OpenBLAS, which says so once.
void sgemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float beta,
           float* C, int ldc) {
  Status st = gemm_sliced(f32_path(), GemmType::kF32, GemmShape{ta, tb, M, N, K, lda, ldb, ldc}, A, B, beta, C);
  if (st.ok()) return;
  static std::once_flag told;
  std::call_once(told, [&] { std::fprintf(stderr, "zoe: warning: %s; that product used OpenBLAS\n", st.message().c_str()); });
}

constexpr bool kNoTrans = false, kTrans = true;  // op(X) = X, X^T

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
  sgemm(kNoTrans, kNoTrans, N, OC, C, inp, C, W, OC, bias ? 1.f : 0.f, out, OC);
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
    sgemm(kNoTrans, kTrans, N, C, OC, dout, OC, W, OC, 1.f, dinp, C);
  if (dW)
    sgemm(kTrans, kNoTrans, C, OC, N, inp, C, dout, OC, 1.f, dW, OC);
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

}  // namespace zoe::gpt2

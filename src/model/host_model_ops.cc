// host_model_ops(): ModelOps straight onto the fp32 CPU reference (gpt2_ops.h).
#include <algorithm>

#include "model/gpt2_ops.h"
#include "model/gpt2_ops_util.h"
#include "model/model_ops.h"

namespace zoe {
namespace {

class HostModelOps final : public ModelOps {
 public:
  void zero(float* x, int64_t n) override {
    gpt2::detail::parallel_range(n, 32768, [&](int64_t a, int64_t b) { std::fill(x + a, x + b, 0.f); });
  }
  void copy(float* dst, const float* src, int64_t n) override {
    gpt2::detail::parallel_range(n, 32768, [&](int64_t a, int64_t b) { std::copy(src + a, src + b, dst + a); });
  }
  void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                       int C) override {
    gpt2::encoder_forward(out, inp, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                        int C) override {
    gpt2::encoder_backward(dwte, dwpe, dout, inp, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int N, int C) override {
    gpt2::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    gpt2::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                      int OC) override {
    gpt2::matmul_forward(out, inp, W, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W,
                       int N, int C, int OC, bool overwrite) override {
    gpt2::matmul_backward(dinp, dW, dbias, dout, inp, W, N, C, OC, overwrite);
  }
  void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) override {
    gpt2::lm_head_forward(logits, inp, wte, N, C, V);
  }
  void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N,
                        int C, int V) override {
    gpt2::lm_head_backward(dinp, dwte, dlogits, inp, wte, N, C, V);
  }
  void encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe, int B, int T,
                            int C) override {
    gpt2::encoder_forward_bf16(out, inp, wte, wpe, B, T, C);
  }
  void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* inp, const float* w,
                              const float* b, int N, int C) override {
    gpt2::layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C);
  }
  void gelu_forward_bf16(uint16_t* out, const float* inp, int64_t N) override { gpt2::gelu_forward_bf16(out, inp, N); }
  void matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                           int OC) override {
    gpt2::matmul_forward_bf16(out, inp, W, bias, N, C, OC);
  }
  void matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                           int OC) override {
    gpt2::matmul_forward_bf16(out, inp, W, bias, N, C, OC);
  }
  void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout, const uint16_t* inp,
                            const uint16_t* W, int N, int C, int OC, uint16_t* scratch, bool overwrite) override {
    gpt2::matmul_backward_bf16(dinp, dW, dbias, dout, inp, W, N, C, OC, scratch, overwrite);
  }
  void lm_head_forward_bf16(float* logits, const float* inp, const uint16_t* wte, int N, int C, int V,
                            uint16_t* scratch) override {
    gpt2::lm_head_forward_bf16(logits, inp, wte, N, C, V, scratch);
  }
  void lm_head_backward_bf16(float* dinp, float* dwte, const float* dlogits, const float* inp, const uint16_t* wte,
                             int N, int C, int V, uint16_t* scratch) override {
    gpt2::lm_head_backward_bf16(dinp, dwte, dlogits, inp, wte, N, C, V, scratch);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) override {
    gpt2::attention_forward(out, lse, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                          int NH) override {
    gpt2::attention_backward(dqkv, dout, qkv, lse, B, T, C, NH);
  }
  void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH) override {
    gpt2::attention_forward_bf16(out, lse, qkv, B, T, C, NH);
  }
  void attention_backward_bf16(float* dqkv, const float* dout, const uint16_t* qkv, const float* lse, int B, int T,
                               int C, int NH) override {
    gpt2::attention_backward_bf16(dqkv, dout, qkv, lse, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, int64_t N) override { gpt2::gelu_forward(out, inp, N); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, bool overwrite) override {
    gpt2::gelu_backward(dinp, inp, dout, N, overwrite);
  }
  void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N) override {
    gpt2::residual_forward(out, inp1, inp2, N);
  }
  void crossentropy(float* loss, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                    float dscale) override {
    *loss = gpt2::crossentropy_forward_backward(dlogits, nullptr, logits, targets, N, V, dscale);
  }
};

}  // namespace

ModelOps& host_model_ops() {
  static HostModelOps ops;
  return ops;
}

}  // namespace zoe

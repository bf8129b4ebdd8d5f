#include "cpu/cpu_model_ops.h"

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cpu/cpu_device.h"

namespace zoe {
namespace {

class CpuModelOps final : public ModelOps {
 public:
  explicit CpuModelOps(CpuDevice& d) : d_(d), h_(host_model_ops()) {}

  std::map<std::string, double> take_op_seconds() override {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(seconds_, {});
  }

  void zero(float* x, int64_t n) override {
    Guard g(this, "zero", {x});
    h_.zero(x, n);
  }
  void copy(float* dst, const float* src, int64_t n) override {
    Guard g(this, "copy", {dst, src});
    h_.copy(dst, src, n);
  }
  void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                       int C) override {
    Guard g(this, "encoder_forward", {out, inp, wte, wpe});
    h_.encoder_forward(out, inp, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                        int C) override {
    Guard g(this, "encoder_backward", {dwte, dwpe, dout, inp});
    h_.encoder_backward(dwte, dwpe, dout, inp, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int N, int C) override {
    Guard g(this, "layernorm_forward", {out, mean, rstd, inp, w, b});
    h_.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    Guard g(this, "layernorm_backward", {dinp, dw, db, dout, inp, w, mean, rstd});
    h_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                      int OC) override {
    Guard g(this, "matmul_forward", {out, inp, W, bias});
    h_.matmul_forward(out, inp, W, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W,
                       int N, int C, int OC, bool overwrite) override {
    Guard g(this, "matmul_backward", {dinp, dW, dbias, dout, inp, W});
    h_.matmul_backward(dinp, dW, dbias, dout, inp, W, N, C, OC, overwrite);
  }
  void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) override {
    Guard g(this, "lm_head_forward", {logits, inp, wte});
    h_.lm_head_forward(logits, inp, wte, N, C, V);
  }
  void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N,
                        int C, int V) override {
    Guard g(this, "lm_head_backward", {dinp, dwte, dlogits, inp, wte});
    h_.lm_head_backward(dinp, dwte, dlogits, inp, wte, N, C, V);
  }
  void encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe, int B, int T,
                            int C) override {
    Guard g(this, "encoder_forward_bf16", {out, inp, wte, wpe});
    h_.encoder_forward_bf16(out, inp, wte, wpe, B, T, C);
  }
  void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* inp, const float* w,
                              const float* b, int N, int C) override {
    Guard g(this, "layernorm_forward_bf16", {out, mean, rstd, inp, w, b});
    h_.layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C);
  }
  void gelu_forward_bf16(uint16_t* out, const float* inp, int64_t N) override {
    Guard g(this, "gelu_forward_bf16", {out, inp});
    h_.gelu_forward_bf16(out, inp, N);
  }
  void matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                           int OC) override {
    Guard g(this, "matmul_forward_bf16", {out, inp, W, bias});
    h_.matmul_forward_bf16(out, inp, W, bias, N, C, OC);
  }
  void matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N, int C,
                           int OC) override {
    Guard g(this, "matmul_forward_bf16", {out, inp, W, bias});
    h_.matmul_forward_bf16(out, inp, W, bias, N, C, OC);
  }
  void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout, const uint16_t* inp,
                            const uint16_t* W, int N, int C, int OC, uint16_t* scratch, bool overwrite) override {
    Guard g(this, "matmul_backward_bf16", {dinp, dW, dbias, dout, inp, W, scratch});
    h_.matmul_backward_bf16(dinp, dW, dbias, dout, inp, W, N, C, OC, scratch, overwrite);
  }
  void lm_head_forward_bf16(float* logits, const float* inp, const uint16_t* wte, int N, int C, int V,
                            uint16_t* scratch) override {
    Guard g(this, "lm_head_forward_bf16", {logits, inp, wte, scratch});
    h_.lm_head_forward_bf16(logits, inp, wte, N, C, V, scratch);
  }
  void lm_head_backward_bf16(float* dinp, float* dwte, const float* dlogits, const float* inp, const uint16_t* wte,
                             int N, int C, int V, uint16_t* scratch) override {
    Guard g(this, "lm_head_backward_bf16", {dinp, dwte, dlogits, inp, wte, scratch});
    h_.lm_head_backward_bf16(dinp, dwte, dlogits, inp, wte, N, C, V, scratch);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) override {
    Guard g(this, "attention_forward", {out, lse, qkv});
    h_.attention_forward(out, lse, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                          int NH) override {
    Guard g(this, "attention_backward", {dqkv, dout, qkv, lse});
    h_.attention_backward(dqkv, dout, qkv, lse, B, T, C, NH);
  }
  void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH) override {
    Guard g(this, "attention_forward_bf16", {out, lse, qkv});
    h_.attention_forward_bf16(out, lse, qkv, B, T, C, NH);
  }
  void attention_backward_bf16(float* dqkv, const float* dout, const uint16_t* qkv, const float* lse, int B, int T,
                               int C, int NH) override {
    Guard g(this, "attention_backward_bf16", {dqkv, dout, qkv, lse});
    h_.attention_backward_bf16(dqkv, dout, qkv, lse, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, int64_t N) override {
    Guard g(this, "gelu_forward", {out, inp});
    h_.gelu_forward(out, inp, N);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, bool overwrite) override {
    Guard g(this, "gelu_backward", {dinp, inp, dout});
    h_.gelu_backward(dinp, inp, dout, N, overwrite);
  }
  void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N) override {
    Guard g(this, "residual_forward", {out, inp1, inp2});
    h_.residual_forward(out, inp1, inp2, N);
  }
  void crossentropy(float* loss, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                    float dscale) override {
    Guard g(this, "crossentropy", {loss, dlogits, logits, targets});
    h_.crossentropy(loss, dlogits, logits, targets, N, V, dscale);
  }

 private:
  // Checks the op's pointers (null ones are skipped: optional outputs), then keeps the fence
  // open for the op and times it. An unreachable pointer is a bug in the model: it stops the
  // process with the op's name, as a GPU kernel reading host memory would fault.
  class Guard {
   public:
    Guard(CpuModelOps* o, const char* op, std::initializer_list<const void*> ptrs)
        : o_(o), op_(op), open_(o->d_.fence()), start_(std::chrono::steady_clock::now()) {
      for (const void* p : ptrs) {
        if (!p) continue;
        Status st = o->d_.check_reachable(p, 1, op);
        if (!st.ok()) {
          std::fprintf(stderr, "zoe: %s\n", st.message().c_str());
          std::abort();
        }
      }
    }

    ~Guard() {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      std::lock_guard<std::mutex> l(o_->mu_);
      o_->seconds_[op_] += s;
    }

   private:
    CpuModelOps* o_;
    const char* op_;
    MemoryFence::Open open_;
    std::chrono::steady_clock::time_point start_;
  };

  CpuDevice& d_;
  ModelOps& h_;
  std::mutex mu_;  // one model calls at a time; the lock keeps a bench's reads safe anyway
  std::map<std::string, double> seconds_;
};

}  // namespace

std::unique_ptr<ModelOps> make_cpu_model_ops(CpuDevice& dev) { return std::make_unique<CpuModelOps>(dev); }

}  // namespace zoe

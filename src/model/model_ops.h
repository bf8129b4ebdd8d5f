// ModelOps: the compute kernels models are written in, one implementation per device (the
// device's ops()). Every pointer is memory of that device (or host memory it can reach, see
// zoe/device.h); every call is enqueued on the device's compute stream and returns at once, so a
// model reads a result on the host only through Device::download.
//
// The semantics, sizes and output rules are those of the fp32 CPU reference in gpt2_ops.h
// (forward outputs overwritten, backward outputs ACCUMULATED, a null d* skipped; where a backward
// takes `overwrite`, its outputs are overwritten instead: no zeroing pass first); host_model_ops()
// runs exactly those functions on host memory (tests, and the CPU device's ops underneath).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "zoe/status.h"

namespace zoe {

class ModelOps {
 public:
  virtual ~ModelOps() = default;

  // Seconds each op kind took since the last call (then reset), for benchmarks' breakdowns; ops
  // that do not time themselves (a GPU's, whose calls only enqueue) give an empty map.
  virtual std::map<std::string, double> take_op_seconds() { return {}; }

  // The first failure of an op since construction (a launch, a library call, an allocation, a
  // shape this device cannot run), naming the op and its sizes; later calls still run. Ops return
  // nothing and only enqueue, so a model reads this before it hands an op's result on (a gradient
  // to the engine, the loss to the host): a failed op never becomes a finished step.
  virtual Status status() const { return Status::Ok(); }
  // Whether this device's kernels run the GPT-2 attention at these sizes (B sequences of T
  // positions, C channels in NH heads); asked before any step, so that a shape they cannot run is
  // a configuration error, not a failure in the middle of training.
  virtual Status supports_attention(int B, int T, int C, int NH) const {
    (void)B, (void)T, (void)C, (void)NH;
    return Status::Ok();
  }

  virtual void zero(float* x, int64_t n) = 0;
  virtual void copy(float* dst, const float* src, int64_t n) = 0;

  virtual void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                               int C) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                                int C) = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                 const float* b, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                  const float* w, const float* mean, const float* rstd, int N, int C) = 0;
  virtual void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                              int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp,
                               const float* W, int N, int C, int OC, bool overwrite) = 0;
  virtual void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) = 0;
  virtual void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte,
                                int N, int C, int V) = 0;
  // bf16 compute (gpt2_ops.h, "bf16 compute"): weights are bf16 device memory read in place; a
  // linear layer's input is bf16, written so by its producer (the *_bf16 forwards below); the
  // other activations a product reads are rounded into scratch (device memory).
  virtual void encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe,
                                    int B, int T, int C) = 0;
  virtual void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* inp, const float* w,
                                      const float* b, int N, int C) = 0;
  virtual void gelu_forward_bf16(uint16_t* out, const float* inp, int64_t N) = 0;
  virtual void matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N,
                                   int C, int OC) = 0;
  // The same with out rounded to bf16 (c_attn's: the attention reads qkv in bf16).
  virtual void matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N,
                                   int C, int OC) = 0;
  virtual void matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout, const uint16_t* inp,
                                    const uint16_t* W, int N, int C, int OC, uint16_t* scratch, bool overwrite) = 0;
  virtual void lm_head_forward_bf16(float* logits, const float* inp, const uint16_t* wte, int N, int C, int V,
                                    uint16_t* scratch) = 0;
  virtual void lm_head_backward_bf16(float* dinp, float* dwte, const float* dlogits, const float* inp,
                                     const uint16_t* wte, int N, int C, int V, uint16_t* scratch) = 0;
  virtual void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T,
                                  int C, int NH) = 0;
  // bf16 compute's attention (gpt2_ops.h): qkv in bf16, bf16 products, fp32 softmax, out rounded
  // to bf16, dqkv fp32. A device without bf16 products in its attention widens qkv and runs its
  // fp32 arithmetic (the CUDA device does, for now).
  virtual void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C,
                                      int NH) = 0;
  virtual void attention_backward_bf16(float* dqkv, const float* dout, const uint16_t* qkv, const float* lse, int B,
                                       int T, int C, int NH) = 0;
  virtual void gelu_forward(float* out, const float* inp, int64_t N) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, bool overwrite) = 0;
  virtual void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N) = 0;
  // *loss (device memory) = the mean over N positions of -log softmax(logits)[target];
  // dlogits as gpt2::crossentropy_forward_backward (may alias logits; null: forward only).
  virtual void crossentropy(float* loss, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                            float dscale) = 0;
};

// The CPU reference functions of gpt2_ops.h on host memory, run on the calling thread.
ModelOps& host_model_ops();

}  // namespace zoe

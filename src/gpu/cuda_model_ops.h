// CudaModelOps: the model's compute kernels (ops/model_ops.h) on one CUDA device, fp32 (and
// bf16 products for bf16 compute).
//
// Every pointer is device memory (or host memory the device can reach); every call is enqueued on
// the compute stream given at construction and returns at once. Semantics, sizes and output rules
// are exactly those of the fp32 CPU reference (ops/gpt2_ops.h): forward outputs overwritten,
// backward outputs ACCUMULATED, a null d* skipped, the same aliasing allowances.
//
// GEMMs run through cuBLASLt in plain fp32 (CUBLAS_COMPUTE_32F) so that results agree with the CPU
// to fp32 rounding; `allow_tf32` trades that parity for TF32 tensor-core speed. The bf16 attention
// runs on cuDNN's fused attention where the build and GPU have it (AttentionKernels below).
// Everything else is this file's own kernels. Every reduction has a fixed order (no float atomics;
// cuDNN's deterministic backward), so a call gives bitwise the same result every time on the same
// GPU model with the same shapes.
//
// Errors: ModelOps calls return nothing, so the first failure (a CUDA or cuBLASLt error, a shape
// the kernels do not support) is kept and returned by status(), its message naming the op and its
// sizes; later calls still run. Errors that happen asynchronously inside kernels
// surface at the next synchronization of the stream, as for any CUDA work.
//
// Device memory held besides the caller's buffers (workspace_bytes()): the cuBLASLt workspace
// (32 MiB), cuDNN's attention workspace and a scratch buffer for reduction partials, which grow to
// the largest need they have met (a few MiB for GPT-2 shapes; growing waits for the compute stream
// once). All of it comes from the RawMemory given at construction: a CudaDevice's budget.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "gpu/raw_memory.h"
#include "ops/model_ops.h"
#include "zoe/status.h"

namespace zoe::gpu {

class CudaOpTimer;
class CudnnAttention;
struct GemmKey;   // a cuBLASLt configuration (cuda_model_ops.cu)
struct GemmPlan;  // its cached descriptors and algorithm
// cuBLASLt's epilogues zoe uses: kBias adds bias[m] to each column of D; kGeluAuxBias adds it,
// stores the sums into aux (D's type and shape) and applies GELU (tanh form); kDGeluBGrad
// multiplies D by GELU' of aux and WRITES D's fp32 row sums (before D's rounding) into bias.
enum class GemmEpilogue { kNone, kBias, kGeluAuxBias, kDGeluBGrad };

class CudaModelOps final : public ModelOps {
 public:
  // `compute_stream` is borrowed (the device owns it; destroy the ops first). allow_tf32: GEMMs
  // may round their inputs to TF32 on tensor cores (many times faster on A100/H100, but no longer
  // within 1e-5 of the CPU). `memory`: where workspaces and scratch come from (none given:
  // cudaMalloc); it must outlive the ops.
  explicit CudaModelOps(cudaStream_t compute_stream, bool allow_tf32 = false, RawMemory memory = {});
  ~CudaModelOps() override;
  CudaModelOps(const CudaModelOps&) = delete;
  CudaModelOps& operator=(const CudaModelOps&) = delete;

  // The first error since construction (or since clear_status()); ok when there was none.
  Status status() const override { return status_; }
  // GPU seconds per op since the last call, from events around each op (CudaOpTimer); the first
  // call starts the timing and returns nothing. Waits for the compute stream to run the ops.
  std::map<std::string, double> take_op_seconds() override;
  // Head size at most 128, B * NH at most 65535 (the grid's y limit).
  Status supports_attention(int B, int T, int C, int NH) const override;
  void clear_status() { static_cast<void>(status_ = Status::Ok()); }
  // Device bytes this object holds: cuBLASLt's and cuDNN's workspaces + scratch.
  size_t workspace_bytes() const override;
  bool allow_tf32() const { return allow_tf32_; }

  // Which kernels run the bf16 attention. kAuto (the default): cuDNN's fused flash attention
  // (cudnn_attention.h) where this build and machine have it and it has an engine for the shape,
  // else zoe's tensor-core kernels, said once on stderr. kCudnn: cuDNN or the op fails, naming
  // why. kTensorCores: zoe's (cuda_attention_mma.cuh; P, dout and dS rounded to bf16 as
  // FlashAttention rounds them). kFp32: the fp32 kernels on qkv widened as their tiles load
  // (cuda_attention.cuh: the reference the tests hold the others to). The environment's
  // ZOE_CUDA_ATTENTION (auto, cudnn, mma, fp32) sets it at construction.
  enum class AttentionKernels { kAuto, kCudnn, kTensorCores, kFp32 };
  void set_attention_kernels(AttentionKernels k) { attention_kernels_ = k; }
  // Ok where cuDNN runs the bf16 attention of this shape (its plans built now, once), else why not.
  Status cudnn_attention_status(int B, int T, int C, int NH);
  // Where cuBLASLt has no algorithm that rounds the LM head's logits, they are rounded from an fp32
  // product made rows at a time through a scratch of at most this many floats (tests make it small).
  void set_head_scratch_floats(int64_t n) { head_scratch_floats_ = n; }

  // The op set (ops/model_ops.def). Of the bf16 ops, matmul_forward_bf16 with a bf16 out rounds
  // in the product's epilogue where cuBLASLt has one (else through scratch).
#define ZOE_OP(name, params, args, ptrs) void name params override;
#include "ops/model_ops.def"
#undef ZOE_OP

 private:
  struct Gemm;  // cuBLASLt handle, workspace and cached matmul plans (cuda_model_ops.cu)
  // Names the public op that runs, with its sizes, in the errors recorded meanwhile; once timing
  // is on, brackets it with timer_'s events (the outer op only: an op run by another is its time).
  struct OpScope {
    OpScope(CudaModelOps* o, const char* op_name, std::initializer_list<std::pair<const char*, int64_t>> sizes);
    ~OpScope();
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;
    std::string text() const;  // "matmul_forward(N 8, C 32, OC 96)"
    CudaModelOps* ops;
    const char* name;
    std::array<std::pair<const char*, int64_t>, 4> dims{};
    size_t n;
  };

  // Records the first error; each returns whether the call succeeded.
  bool fail(Status s);
  bool check(cudaError_t e, const char* what);
  bool check_launch(const char* what);
  // Device scratch of at least `bytes`, valid until the next scratch() call for the same slot
  // (nullptr on failure, with the error recorded). Slot kHeld keeps an op's fp32 intermediate
  // while the kernels and sums it runs take kOps.
  enum ScratchSlot { kOps = 0, kHeld = 1 };
  void* scratch(size_t bytes, ScratchSlot slot = kOps);
  // `bytes` from memory_, or nullptr with the error recorded, naming `what`.
  void* take_memory(size_t bytes, const char* what);
  // D[m x n] = op(A) op(B) + beta * D in cuBLAS's column-major view (cuda_model_ops.cu).
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
            int64_t ldb, float* D, int64_t ldd, float beta, const char* what);
  // The same on bf16 operands (fp32 accumulation and D).
  void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t* A, int64_t lda,
                 const uint16_t* B, int64_t ldb, float* D, int64_t ldd, float beta, const char* what);
  void gemm_any(bool bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda,
                const void* B, int64_t ldb, float* D, int64_t ldd, float beta, const char* what);
  using Epilogue = GemmEpilogue;
  // D[m x n] = op(A) B through `e`, D contiguous, fp32 or rounded to bf16 by the epilogue; beta
  // 0. False, with nothing queued, where cuBLASLt has no algorithm for it here or refuses the
  // call (said once on stderr), or the bias or aux is missing or not 16-byte aligned, or aux's
  // rows are not a multiple of 8, or DGELU's sums have one term: the caller then runs passes of
  // its own, as before.
  bool gemm_fused(bool bf16, bool ta, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda, const void* B,
                  int64_t ldb, void* D, bool d_bf16, Epilogue e, const void* bias, const void* aux, const char* what);
  // `bias`, `aux`: the epilogue's vector and aux matrix, whose addresses the heuristic weighs
  // (null: none).
  GemmPlan* plan_for(const GemmKey& key, const char* what, const void* bias = nullptr, const void* aux = nullptr);
  // Queues the product: true, or a failure recorded naming `what`; false, with nothing queued,
  // where cuBLASLt refuses a fused plan at the call (the plan is marked: the caller's passes).
  bool run(GemmPlan& plan, const void* A, const void* B, float beta, void* D, const void* bias, const void* aux,
           const char* what);
  void round_to_bf16(uint16_t* dst, const float* src, int64_t n, const char* what);
  // dst[c] += sum over rows r < N of val(r, c), c < ncols, in a fixed order (defined and used in
  // cuda_model_ops.cu only).
  template <class Val>
  void column_reduce(float* dst, const Val& val, int64_t N, int ncols, const char* what);
  template <class L, class D>
  void crossentropy_any(float* loss, D* dlogits, const L* logits, const int32_t* targets, int N, int V, float dscale,
                        const char* what);
  template <class Out>
  void layernorm_forward_any(Out* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                             int N, int C, const char* what);
  template <class Out, class In>
  void attention_forward_any(Out* out, float* lse, const In* qkv, int B, int T, int C, int NH);
  template <int HSP, class Out, class In>
  void attention_forward_hsp(Out* out, float* lse, const In* qkv, int B, int T, int C, int NH);
  template <class Out, class In>
  void attention_backward_any(float* dqkv, const float* dout, const Out* out, const In* qkv, const float* lse, int B,
                              int T, int C,
                              int NH);
  // Whether the kernels run this attention shape (*hsp: their padded head size); else records why.
  bool attention_shape_ok(int B, int T, int C, int NH, int* hsp);
  // The bf16 attention's route: cuDNN, zoe's kernels, or neither (an error was recorded).
  enum class Route { kCudnn, kOwn, kFailed };
  Route attention_route(int B, int T, int C, int NH);
  void attention_backward_cudnn(uint16_t* dqkv, float* dbias, const float* dout, const uint16_t* out,
                                const uint16_t* qkv, const float* lse, int B, int T, int C, int NH, bool overwrite);
  template <int HSP, class Out, class In>
  void attention_backward_hsp(float* dqkv, const float* dout, const Out* out, const In* qkv, const float* lse, int B,
                              int T, int C,
                              int NH);

  cudaStream_t stream_;
  bool allow_tf32_;
  RawMemory memory_;
  AttentionKernels attention_kernels_ = AttentionKernels::kAuto;
  std::unique_ptr<CudnnAttention> cudnn_;  // created at the first bf16 attention that may use it
  Status cudnn_missing_;                    // why there is none, once tried
  bool cudnn_tried_ = false;
  std::set<std::array<int, 4>> cudnn_refused_;  // shapes cuDNN has no engine for (said once each)
  int64_t head_scratch_floats_ = int64_t{16} << 20;  // 64 MiB
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<CudaOpTimer> timer_;  // after the first take_op_seconds()
  std::array<void*, 2> scratch_{};  // by ScratchSlot
  std::array<size_t, 2> scratch_bytes_{};
  Status status_;
  const OpScope* op_ = nullptr;  // the public op that runs (null between ops)
};

// The factory CudaDevice calls: ops on `compute_stream`, fp32 products exact unless allow_tf32
// (zoe.allow_tf32). Check
// static_cast<CudaModelOps&>(*ops).status() after construction: without a usable GPU or cuBLASLt
// it holds the reason, and GEMM calls fail.
std::unique_ptr<ModelOps> make_cuda_model_ops(cudaStream_t compute_stream, bool allow_tf32 = false,
                                              RawMemory memory = {});

}  // namespace zoe::gpu

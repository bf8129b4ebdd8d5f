// CudaModelOps' attention: zoe's kernels (cuda_attention.cuh in fp32 and bf16, cuda_attention_mma.cuh
// on tensor cores) and cuDNN's (cudnn_attention.h), routed per shape. Its own file: these kernels'
// templates are most of CudaModelOps' compile. See cuda_model_ops.h for the contract.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>

#include "gpu/cuda_attention.cuh"
#include "gpu/cuda_attention_mma.cuh"
#include "gpu/cuda_kernel_util.cuh"
#include "gpu/cuda_model_ops.h"
#include "gpu/cuda_model_ops_util.h"
#include "gpu/cudnn_attention.h"

namespace zoe::gpu {

namespace k = kernels;

namespace {

// Checks the shapes and sets *hsp to the padded head size (32, 64, 128) the kernels run for.
// (The message is built only for a shape that fails: every attention call passes here.)
Status attention_shape(int B, int T, int C, int NH, int* hsp) {
  auto shape = [&] { return "attention" + shape_text("", {B, T, C, NH}); };
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    return Status::Invalid(shape() + ": C must be a positive multiple of NH, B and T >= 0");
  const int hs = C / NH;
  if (hs > 128)
    return Status::Unsupported(shape() + ": head size " + std::to_string(hs) +
                               " > 128 is not supported by the CUDA kernels");
  if (int64_t{B} * NH > 65535) return Status::Unsupported(shape() + ": B * NH > 65535 (the grid's y limit)");
  *hsp = hs <= 32 ? 32 : hs <= 64 ? 64 : 128;
  return Status::Ok();
}

// Lets `kernel` use `bytes` of dynamic shared memory (above the 48 KiB default needs an opt-in).
template <class Kernel>
cudaError_t allow_smem(Kernel* kernel, size_t bytes) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

}  // namespace

template <int HSP, class Out, class In>
void CudaModelOps::attention_forward_hsp(Out* out, float* lse, const In* qkv, int B, int T, int C, int NH) {
  using G = k::AttnTile<HSP>;
  const int hs = C / NH;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  if constexpr (std::is_same_v<In, uint16_t>) {
    if (attention_kernels_ != AttentionKernels::kFp32) {
      const dim3 grid((T + k::kMmaRows - 1) / k::kMmaRows, B * NH);
      const size_t smem = k::MmaSmem<HSP>::kForward;
      if (!check(allow_smem(k::attention_forward_mma_kernel<HSP, Out>, smem), "attention_forward shared memory")) return;
      ZOE_LAUNCH(grid, k::kMmaThreads, smem, stream_, k::attention_forward_mma_kernel<HSP, Out>)(out, lse, qkv, T, C,
                                                                                               NH, hs, scale);
      check_launch("attention_forward");
      return;
    }
  }
  const dim3 grid((T + G::BT - 1) / G::BT, B * NH);
  const size_t smem = sizeof(float) * G::kForwardFloats;
  if (!check(allow_smem(k::attention_forward_kernel<HSP, Out, In>, smem), "attention_forward shared memory")) return;
  ZOE_LAUNCH(grid, k::kAttnThreads, smem, stream_, k::attention_forward_kernel<HSP, Out, In>)(out, lse, qkv, T, C,
                                                                                              NH, hs, scale);
  check_launch("attention_forward");
}

template <int HSP, class Out, class In>
void CudaModelOps::attention_backward_hsp(float* dqkv, const float* dout, const Out* out, const In* qkv,
                                          const float* lse, int B, int T, int C, int NH) {
  using G = k::AttnTile<HSP>;
  const int hs = C / NH;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  const int64_t rows = int64_t{B} * NH * T;
  auto* D = static_cast<float*>(scratch(sizeof(float) * rows));
  if (!D) return;
  const bool tensor_cores = std::is_same_v<In, uint16_t> && attention_kernels_ != AttentionKernels::kFp32;
  ZOE_LAUNCH(grid_for(rows, k::kThreads), k::kThreads, 0, stream_, k::attention_rowdot_kernel<Out>)(D, dout, out, B, T,
                                                                                                  C, NH, hs,
                                                                                                  tensor_cores);
  if (!check_launch("attention_backward D")) return;
  if constexpr (std::is_same_v<In, uint16_t>) {
    if (tensor_cores) {
      const dim3 grid((T + k::kMmaRows - 1) / k::kMmaRows, B * NH);
      const size_t smem_dq = k::MmaSmem<HSP>::kDq, smem_dkv = k::MmaSmem<HSP>::kDkv;
      if (!check(allow_smem(k::attention_dq_mma_kernel<HSP>, smem_dq), "attention_backward shared memory") ||
          !check(allow_smem(k::attention_dkv_mma_kernel<HSP>, smem_dkv), "attention_backward shared memory"))
        return;
      ZOE_LAUNCH(grid, k::kMmaThreads, smem_dq, stream_, k::attention_dq_mma_kernel<HSP>)(dqkv, D, dout, qkv, lse, T,
                                                                                       C, NH, hs, scale);
      if (!check_launch("attention_backward dq")) return;
      ZOE_LAUNCH(grid, k::kMmaThreads, smem_dkv, stream_, k::attention_dkv_mma_kernel<HSP>)(dqkv, dout, qkv, lse, D, T,
                                                                                         C, NH, hs, scale);
      check_launch("attention_backward dkv");
      return;
    }
  }
  const dim3 grid((T + G::BT - 1) / G::BT, B * NH);
  const size_t smem_dq = sizeof(float) * G::kDqFloats, smem_dkv = sizeof(float) * G::kDkvFloats;
  if (!check(allow_smem(k::attention_dq_kernel<HSP, In>, smem_dq), "attention_backward shared memory") ||
      !check(allow_smem(k::attention_dkv_kernel<HSP, In>, smem_dkv), "attention_backward shared memory"))
    return;
  ZOE_LAUNCH(grid, k::kAttnThreads, smem_dq, stream_, k::attention_dq_kernel<HSP, In>)(dqkv, D, dout, qkv, lse, T, C,
                                                                                   NH, hs, scale);
  if (!check_launch("attention_backward dq")) return;
  ZOE_LAUNCH(grid, k::kAttnThreads, smem_dkv, stream_, k::attention_dkv_kernel<HSP, In>)(dqkv, dout, qkv, lse, D, T, C,
                                                                                     NH, hs, scale);
  check_launch("attention_backward dkv");
}

bool CudaModelOps::attention_shape_ok(int B, int T, int C, int NH, int* hsp) {
  Status s = attention_shape(B, T, C, NH, hsp);
  return s.ok() || fail(std::move(s));
}

template <class Out, class In>
void CudaModelOps::attention_forward_any(Out* out, float* lse, const In* qkv, int B, int T, int C, int NH) {
  int hsp = 0;
  if (!attention_shape_ok(B, T, C, NH, &hsp)) return;
  if (B == 0 || T == 0) return;
  if (hsp == 32) attention_forward_hsp<32>(out, lse, qkv, B, T, C, NH);
  else if (hsp == 64) attention_forward_hsp<64>(out, lse, qkv, B, T, C, NH);
  else attention_forward_hsp<128>(out, lse, qkv, B, T, C, NH);
}

void CudaModelOps::attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const OpScope scope(this, "attention_forward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}});
  attention_forward_any(out, lse, qkv, B, T, C, NH);
}

Status CudaModelOps::cudnn_attention_status(int B, int T, int C, int NH) {
  if (!cudnn_tried_) {
    cudnn_tried_ = true;
    static_cast<void>(cudnn_missing_ = CudnnAttention::create(stream_, memory_, &cudnn_));  // ([[nodiscard]])
  }
  return cudnn_ ? cudnn_->prepare(B, T, C, NH) : cudnn_missing_;
}

// A build without cuDNN (the emulation's) says nothing of it: zoe's kernels are its only path.
CudaModelOps::Route CudaModelOps::attention_route(int B, int T, int C, int NH) {
  if (attention_kernels_ != AttentionKernels::kAuto && attention_kernels_ != AttentionKernels::kCudnn)
    return Route::kOwn;
  Status s = cudnn_attention_status(B, T, C, NH);
  if (s.ok()) return Route::kCudnn;
  if (attention_kernels_ == AttentionKernels::kCudnn) {
    fail(s.prefixed("ZOE_CUDA_ATTENTION=cudnn: "));
    return Route::kFailed;
  }
#ifdef ZOE_HAVE_CUDNN
  if (cudnn_refused_.insert({B, T, C, NH}).second)
    std::fprintf(stderr, "zoe: the bf16 attention (B %d, T %d, C %d, NH %d) runs on zoe's tensor-core kernels: %s\n",
                 B, T, C, NH, s.message().c_str());
#endif
  return Route::kOwn;
}

void CudaModelOps::attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C,
                                          int NH) {
  const OpScope scope(this, "attention_forward_bf16", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}});
  int hsp = 0;
  if (!attention_shape_ok(B, T, C, NH, &hsp)) return;
  if (B == 0 || T == 0) return;
  switch (attention_route(B, T, C, NH)) {
    case Route::kFailed: return;
    case Route::kCudnn:
      if (Status s = cudnn_->forward(out, lse, qkv, B, T, C, NH); !s.ok()) fail(std::move(s));
      return;
    case Route::kOwn: break;
  }
  attention_forward_any(out, lse, qkv, B, T, C, NH);
}

void CudaModelOps::attention_backward(float* dqkv, const float* dout, const float* out, const float* qkv,
                                      const float* lse, int B, int T, int C, int NH) {
  const OpScope scope(this, "attention_backward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}});
  attention_backward_any(dqkv, dout, out, qkv, lse, B, T, C, NH);
}

// The kernels' fp32 dqkv into held scratch (they accumulate: zeroed first), then rounded into
// dqkv and summed down its columns for c_attn's dbias.
void CudaModelOps::attention_backward_bf16(uint16_t* dqkv, float* dbias, const float* dout, const uint16_t* out,
                                           const uint16_t* qkv, const float* lse, int B, int T, int C, int NH,
                                           bool overwrite) {
  const OpScope scope(this, "attention_backward_bf16", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}});
  int hsp = 0;
  if (!attention_shape_ok(B, T, C, NH, &hsp)) return;
  const int64_t N = int64_t{B} * T, n = N * 3 * C;
  if (n == 0) return;
  switch (attention_route(B, T, C, NH)) {
    case Route::kFailed: return;
    case Route::kCudnn: attention_backward_cudnn(dqkv, dbias, dout, out, qkv, lse, B, T, C, NH, overwrite); return;
    case Route::kOwn: break;
  }
  auto* f = static_cast<float*>(scratch(sizeof(float) * n, kHeld));
  if (!f || !check(cudaMemsetAsync(f, 0, sizeof(float) * n, stream_), "attention_backward_bf16 zero")) return;
  attention_backward_any(f, dout, out, qkv, lse, B, T, C, NH);
  round_to_bf16(dqkv, f, n, "attention_backward_bf16 round dqkv");
  if (dbias && overwrite) zero(dbias, 3 * C);
  if (dbias) column_reduce(dbias, k::Rows{f, 3 * C}, N, 3 * C, "attention_backward_bf16 dbias");
}

// cuDNN takes dout in bf16 (zoe's tensor-core kernels round it so for their products too) and
// writes dqkv rounded: c_attn's bias gradient is summed from those values.
void CudaModelOps::attention_backward_cudnn(uint16_t* dqkv, float* dbias, const float* dout, const uint16_t* out,
                                            const uint16_t* qkv, const float* lse, int B, int T, int C, int NH,
                                            bool overwrite) {
  const int64_t N = int64_t{B} * T;
  auto* dout16 = static_cast<uint16_t*>(scratch(sizeof(uint16_t) * N * C, kHeld));
  if (!dout16) return;
  round_to_bf16(dout16, dout, N * C, "attention_backward_bf16 round dout");
  if (Status s = cudnn_->backward(dqkv, dout16, out, qkv, lse, B, T, C, NH); !s.ok()) {
    fail(std::move(s));
    return;
  }
  if (dbias && overwrite) zero(dbias, 3 * C);
  if (dbias) column_reduce(dbias, k::RowsOf<uint16_t>{dqkv, 3 * C}, N, 3 * C, "attention_backward_bf16 dbias");
}

template <class Out, class In>
void CudaModelOps::attention_backward_any(float* dqkv, const float* dout, const Out* out, const In* qkv,
                                          const float* lse, int B, int T, int C, int NH) {
  int hsp = 0;
  if (!attention_shape_ok(B, T, C, NH, &hsp)) return;
  if (B == 0 || T == 0) return;
  if (hsp == 32) attention_backward_hsp<32>(dqkv, dout, out, qkv, lse, B, T, C, NH);
  else if (hsp == 64) attention_backward_hsp<64>(dqkv, dout, out, qkv, lse, B, T, C, NH);
  else attention_backward_hsp<128>(dqkv, dout, out, qkv, lse, B, T, C, NH);
}

Status CudaModelOps::supports_attention(int B, int T, int C, int NH) const {
  int hsp = 0;
  return attention_shape(B, T, C, NH, &hsp);
}

}  // namespace zoe::gpu

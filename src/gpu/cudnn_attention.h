// CudnnAttention: GPT-2's causal attention in bf16 through cuDNN's fused flash attention (its
// SDPA graph, forward and backward, through cuDNN's C++ frontend): the library's tensor-core
// kernels where the machine has cuDNN 9. zoe's own kernels (cuda_attention_mma.cuh) stay beside
// it: the reference its tests hold it to, the path the emulation runs, and the fallback for a
// build, a machine or a shape cuDNN has no engine for. CudaModelOps chooses (ZOE_CUDA_ATTENTION).
//
// The layout is the model ops' (ops/model_ops.def): qkv [B,T,3C] (q, k, v along the last axis,
// head h at channels [h*hs, (h+1)*hs)), out [B,T,C], lse [B,NH,T] fp32: the natural log of each
// query's sum of exp over its scaled scores. That is cuDNN's softmax "Stats" too, so either
// path's lse serves the other's backward. bf16 in and out, fp32 softmax and accumulation; the
// scores scaled by 1/sqrt(hs), keys after the query masked (top-left causal).
//
// A shape's plans (forward and backward) are built on its first prepare() and kept. The backward
// is cuDNN's deterministic one (no float atomics into dQ): a call gives the same bits every time.
// The workspace is this object's, grown as plans need (growing waits for the stream once; a
// shape whose larger workspace does not fit is refused, the others keep theirs). On Hopper before
// cuDNN 9.25 the deterministic backward's is O(B x NH x T^2) bytes (~24 MiB a GPT-2 sequence).
// Every call is enqueued on the stream given at creation and returns at once.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gpu/raw_memory.h"
#include "zoe/status.h"

namespace zoe::gpu {

class CudnnAttention {
 public:
  // *out: a cuDNN handle on `stream` (borrowed: destroy this first), its workspace taken from
  // `memory` (which must outlive it); else why there is none: a build without cuDNN, a library
  // that does not load, a GPU it cannot use.
  static Status create(cudaStream_t stream, RawMemory memory, std::unique_ptr<CudnnAttention>* out);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Ok when cuDNN has an engine for this shape, forward and backward (built now, once); else
  // Unsupported, naming cuDNN's reason. The answer is kept: asking again costs a lookup.
  Status prepare(int B, int T, int C, int NH);
  // After an ok prepare() of the shape. out [B,T,C] and lse [B,NH,T] are written.
  Status forward(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH);
  // dqkv [B,T,3C] is WRITTEN (rounded to bf16); dout [B,T,C] is bf16.
  Status backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* out, const uint16_t* qkv, const float* lse,
                  int B, int T, int C, int NH);
  // Device bytes held: the workspace.
  size_t workspace_bytes() const;

  // "cuDNN 9.19.0 (built against ...; frontend 1.32.0; /path/libcudnn.so.9)", or why this build
  // or machine has none. Needs no GPU.
  static std::string version_text();
  // The frontend's own checks of the shape's two graphs for a GPU of compute capability
  // `sm_version` (90: Hopper), what prepare() runs first before it asks the library for engines.
  // Needs no GPU: CI runs it where no plan can be built.
  static Status validate(int B, int T, int C, int NH, int sm_version);

 private:
  struct Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe::gpu

#include "gpu/cuda_op_timer.h"

#include <cuda_runtime.h>

#include <utility>

namespace zoe::gpu {
namespace {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Runtime(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace

CudaOpTimer::~CudaOpTimer() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

Result<cudaEvent_t> CudaOpTimer::next_event() {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    ZOE_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDefault), "cudaEventCreateWithFlags"));
    pool_.push_back(e);
  }
  return pool_[used_++];
}

Status CudaOpTimer::begin(cudaStream_t stream) {
  ZOE_ASSIGN_OR_RETURN(open_, next_event());
  return cuda_status(cudaEventRecord(open_, stream), "cudaEventRecord (op timing)");
}

Status CudaOpTimer::end(const char* name, cudaStream_t stream) {
  if (!open_) return Status::Invalid("CudaOpTimer::end without begin");
  ZOE_ASSIGN_OR_RETURN(cudaEvent_t e, next_event());
  spans_.push_back({name, std::exchange(open_, nullptr), e});
  return cuda_status(cudaEventRecord(e, stream), "cudaEventRecord (op timing)");
}

Status CudaOpTimer::take(std::map<std::string, double>* seconds) {
  seconds->clear();
  if (open_) return Status::Invalid("CudaOpTimer::take inside an op");
  std::vector<Span> spans = std::exchange(spans_, {});
  used_ = 0;  // reused once the stream has passed them all (below)
  if (spans.empty()) return Status::Ok();
  ZOE_RETURN_IF_ERROR(cuda_status(cudaEventSynchronize(spans.back().end), "cudaEventSynchronize (op timing)"));
  for (const Span& s : spans) {
    float ms = 0.f;
    ZOE_RETURN_IF_ERROR(cuda_status(cudaEventElapsedTime(&ms, s.start, s.end), "cudaEventElapsedTime"));
    (*seconds)[s.name] += ms / 1e3;
  }
  return Status::Ok();
}

}  // namespace zoe::gpu

// CudaOpTimer: GPU time per op kind, from a pair of events around each op on its stream.
//
// An op on a GPU only enqueues, so a host clock around it measures the launch, not the kernel.
// begin() and end() record timing events on the stream before and after the op's launches; take()
// waits for the last one and sums end - start per name. Events are pooled: after take() they are
// recorded again. For benchmarks' breakdowns (ModelOps::take_op_seconds); an op pays two event
// records, a few microseconds of host time.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe::gpu {

class CudaOpTimer {
 public:
  CudaOpTimer() = default;
  ~CudaOpTimer();
  CudaOpTimer(const CudaOpTimer&) = delete;
  CudaOpTimer& operator=(const CudaOpTimer&) = delete;

  // Brackets one op named `name` (a string literal: kept by pointer) on `stream`.
  Status begin(cudaStream_t stream);
  Status end(const char* name, cudaStream_t stream);
  // *seconds = seconds per op name since the last take(), once the stream has run them; then
  // starts over. (A Status, not a Result: the kernels' file that calls it is built against the
  // emulation's race hooks, which a Result's function-local static would need more of.)
  Status take(std::map<std::string, double>* seconds);

 private:
  Result<cudaEvent_t> next_event();

  struct Span {
    const char* name;
    cudaEvent_t start, end;
  };
  std::vector<cudaEvent_t> pool_;  // every event made; the first used_ are in spans_ or open_
  size_t used_ = 0;
  std::vector<Span> spans_;
  cudaEvent_t open_ = nullptr;  // begin()'s event, until end()
};

}  // namespace zoe::gpu

// The CUDA device: one GPU, five non-blocking streams (Stream::kCompute, kH2D, kD2H, kComm, kCommThread),
// device memory from a caching allocator within zoe.device_memory_budget, pinned host memory
// (cudaHostAlloc, cached the same way) within zoe.host_memory_budget, and the engine's kernels
// (device_kernels.h, adam_cuda.h) on the compute stream.
//
// Events: each stream has a ring of kEventRing CUDA events; record() takes the next one (seq is
// the stream's record count). An event older than kEventRing records of its stream stands for
// the newest one in its slot: waiting for it then waits for later work of the same stream too,
// which is never wrong (that work was enqueued before the wait, so no cycle can form) and only
// late.
//
// Memory reuse: a freed buffer goes back to the cache at once and the next alloc may hand it
// out. Work in flight that still uses a buffer on another stream than its next user's must be
// waited for (wait_on, or wait) before free, as on the CPU device.
//
// Every call makes the device current on the calling thread first (cudaSetDevice), so any
// thread may use it. Host code never touches device memory: HostAccess is a no-op here.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/caching_allocator.h"
#include "zoe/device.h"

namespace zoe {

class CudaDevice final : public Device {
 public:
  static constexpr uint64_t kEventRing = 1024;

  // Use make_cuda_device (it checks the GPU first).
  static Result<std::unique_ptr<CudaDevice>> create(int gpu_index, size_t device_budget, size_t host_budget,
                                                     bool allow_tf32 = false);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const char* name() const override { return "cuda"; }
  int gpu() const { return gpu_; }
  Place place() const override { return {true, gpu_}; }
  // The CUDA stream behind `s`, for NcclComm and the model ops.
  cudaStream_t stream(Stream s) const { return streams_[static_cast<int>(s)]; }
  // Makes this GPU the calling thread's current device (cudaSetDevice).
  Status make_current() const;
  // What the allocators hold (tests, reports).
  gpu::CachingAllocator::Stats device_memory() const { return device_mem_->stats(); }
  gpu::CachingAllocator::Stats host_memory() const { return host_mem_->stats(); }

  Result<Buffer> alloc(size_t bytes, Tier tier, Kind kind) override;
  void free(Buffer& b) override;
  // The rounding of the blocks in use (512 bytes, against the CPU arena's 64).
  uint64_t unbooked_bytes(Tier tier) const override;
  Status register_host(void* p, size_t bytes) override;
  void unregister_host(void* p) override;

  Status copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off, size_t bytes,
                    Stream stream) override;
  Status copy(void* dst, const void* src, size_t bytes, Stream stream) override;
  Status upload(void* dst, const void* host_src, size_t bytes) override;
  Status download(void* host_dst, const void* src, size_t bytes) override;
  uint64_t copied_bytes(Stream stream) const override { return copied_[static_cast<int>(stream)].load(); }
  Status zero(void* dst, size_t bytes, Stream stream = Stream::kCompute) override;

  Event record(Stream stream) override;
  bool done(Event e) override;
  Status wait(Event e) override;
  Status wait_on(Stream waiter, Event e) override;
  Status wait_external(void* stream) override;
  Status external_wait_on(void* stream, Event e) override;
  Status synchronize() override;

  Status accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                    bool accumulate, Stream stream = Stream::kCompute) override;
  Status sum_chunks(void* out, const void* chunks, int n, size_t count, DType dtype) override;
  // sum_chunks on `stream` (NcclComm sums on its own stream).
  Status sum_chunks_on(Stream stream, void* out, const void* chunks, int n, size_t count, DType dtype);
  Status sum_squares(const ArrayView* spans, size_t count, double* out) override;
  Status adam(const AdamHyper& h, const AdamRange* ranges, size_t count, uint64_t* nonfinite) override;

  // Built on first use by gpu::make_cuda_model_ops (src/gpu/cuda_model_ops.h) on the compute
  // stream; their own errors are kept by them (see that header).
  ModelOps& ops() override;

 private:
  CudaDevice(int gpu, size_t device_budget, size_t host_budget, bool allow_tf32);
  Status init();
  // The event of `e`, or an error when e was never recorded or its record failed.
  Result<cudaEvent_t> event_of(Event e);
  // upload/download: `copy_stream` waits for the compute stream, copies, and is waited for.
  Status sync_copy(void* dst, const void* src, size_t bytes, Stream copy_stream, const char* what);

  struct Ring {
    std::array<cudaEvent_t, kEventRing> ev{};
    std::array<std::string, kEventRing> error{};  // why the slot's last record failed ("" if it did not)
    uint64_t next = 1;                            // the seq of the next record
  };

  const int gpu_;
  std::array<cudaStream_t, kNumStreams> streams_{};
  std::array<std::atomic<uint64_t>, kNumStreams> copied_{};  // copied_bytes (any thread copies)
  int max_blocks_ = 1;  // blocks of the element-wise kernels: 8 per SM (full occupancy at 256 threads)

  std::unique_ptr<gpu::CachingAllocator> device_mem_, host_mem_;

  std::mutex events_mu_;
  std::array<Ring, kNumStreams> rings_;

  std::mutex host_mu_;
  std::unordered_map<void*, size_t> registered_;  // register_host ranges

  std::mutex squares_mu_;  // one sum_squares at a time: they share the partials buffer
  void* partials_ = nullptr;
  uint64_t partials_cap_ = 0;

  std::once_flag ops_once_;
  std::unique_ptr<ModelOps> ops_;
  bool allow_tf32_ = false;  // zoe.allow_tf32: the ops' fp32 products on TF32 tensor cores
};

// The CUDA device on GPU `gpu_index`, after checking that a driver and that GPU are there and
// run a kernel: else Status::Invalid("config key 'zoe.device': \"cuda\" needs a GPU: <why>").
// allow_tf32: its model ops' fp32 products may run on TF32 tensor cores (zoe.allow_tf32).
Result<std::unique_ptr<Device>> make_cuda_device(int gpu_index, size_t device_budget, size_t host_budget,
                                                 bool allow_tf32 = false);

// The GPU of this process among those visible: the node-local MPI rank
// (OMPI_COMM_WORLD_LOCAL_RANK, else MPI_LOCALRANKID or SLURM_LOCALID; 0 outside mpirun) modulo
// the device count (0 where no GPU is visible; make_cuda_device then says why).
int local_gpu_index();

}  // namespace zoe

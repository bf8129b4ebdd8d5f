// CudaDevice (see cuda_device.h). Host code on the CUDA runtime API, compiled by the C++
// compiler (fmt does not build under nvcc's C++20); the kernels are in device_kernels.cu and
// adam_cuda.cu.
#include "gpu/cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "kernels/adam.h"
#include "gpu/adam_cuda.h"
#include "gpu/cuda_model_ops.h"
#include "gpu/device_kernels.h"
#include "gpu/gpu_info.h"

namespace zoe {
namespace {

std::string cuda_error(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e)); }

// A failed call is reported here, so its error is cleared from the runtime's last-error slot,
// where a later kernel launch check would otherwise find it.
Status check(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  return Status::Runtime(fmt::format("CUDA {} failed: {}", what, cuda_error(e)));
}
// The same with the description built only on failure (calls on the hot path).
template <typename F>
  requires std::invocable<F>
Status check(cudaError_t e, F&& what) {
  if (e == cudaSuccess) return Status::Ok();
  return check(e, std::string_view(what()));
}

[[noreturn]] void fatal(const std::string& m) {
  std::fprintf(stderr, "zoe: internal error: %s\n", m.c_str());
  std::abort();
}

// Teardown cannot return errors: the first one is printed, the rest (a broken context repeats
// itself) are not.
void report_teardown(cudaError_t e, const char* what, bool& reported) {
  if (e == cudaSuccess || reported) return;
  cudaGetLastError();
  std::fprintf(stderr, "zoe: CUDA %s failed while closing the cuda device: %s\n", what, cuda_error(e).c_str());
  reported = true;
}

int stream_index(Stream s) { return static_cast<int>(s); }
bool valid_stream(Stream s) { return stream_index(s) >= 0 && stream_index(s) < kNumStreams; }

}  // namespace

CudaDevice::CudaDevice(int gpu, size_t device_budget, size_t host_budget, bool allow_tf32)
    : gpu_(gpu), allow_tf32_(allow_tf32) {
  gpu::RawMemory device_raw{
      gpu::cuda_raw_memory().malloc,
      [](void* p) {
        // A segment goes back only when the cache is released (a request would pass the budget)
        // or at the end, and work still queued may read a block of it: blocks are freed into the
        // cache in flight, their next user ordered after by events. cudaFree waits for the device
        // anyway; the wait is made here, where it is meant (and where the emulation checks it).
        const cudaError_t sync = cudaDeviceSynchronize(), e = cudaFree(p);
        if (sync != cudaSuccess || e != cudaSuccess) {
          cudaGetLastError();
          std::fprintf(stderr, "zoe: CUDA %s failed: %s\n", sync != cudaSuccess ? "cudaDeviceSynchronize before cudaFree" : "cudaFree",
                       cuda_error(sync != cudaSuccess ? sync : e).c_str());
        }
      }};
  gpu::RawMemory host_raw{
      [](size_t n) -> Result<void*> {
        void* p = nullptr;
        // Mapped: kernels may read it at its host address (unified addressing makes them equal).
        const cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocPortable | cudaHostAllocMapped);
        if (e != cudaSuccess) {
          cudaGetLastError();
          return Status::OutOfMemory("cudaHostAlloc: " + cuda_error(e));
        }
        return p;
      },
      [](void* p) {
        // (As for device segments: queued copies and kernels may still read a block of it.)
        const cudaError_t sync = cudaDeviceSynchronize(), e = cudaFreeHost(p);
        if (sync != cudaSuccess || e != cudaSuccess) {
          cudaGetLastError();
          std::fprintf(stderr, "zoe: CUDA %s failed: %s\n",
                       sync != cudaSuccess ? "cudaDeviceSynchronize before cudaFreeHost" : "cudaFreeHost",
                       cuda_error(sync != cudaSuccess ? sync : e).c_str());
        }
      }};
  device_mem_ = std::make_unique<gpu::CachingAllocator>(device_budget, std::move(device_raw), &ledger_, Tier::kDevice,
                                                        "device memory", "zoe.device_memory_budget");
  host_mem_ = std::make_unique<gpu::CachingAllocator>(host_budget, std::move(host_raw), &ledger_, Tier::kHost,
                                                      "pinned host memory", "zoe.host_memory_budget");
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::create(int gpu_index, size_t device_budget, size_t host_budget,
                                                        bool allow_tf32) {
  std::unique_ptr<CudaDevice> d(new CudaDevice(gpu_index, device_budget, host_budget, allow_tf32));
  ZOE_RETURN_IF_ERROR(d->init());
  return Result<std::unique_ptr<CudaDevice>>(std::move(d));
}

Status CudaDevice::init() {
  ZOE_RETURN_IF_ERROR(make_current());
  for (int s = 0; s < kNumStreams; ++s)
    ZOE_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&streams_[s], cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
  int sms = 0;
  ZOE_RETURN_IF_ERROR(check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, gpu_), "cudaDeviceGetAttribute"));
  max_blocks_ = std::max(1, sms * 8);
  return Status::Ok();
}

CudaDevice::~CudaDevice() {
  bool reported = false;
  report_teardown(cudaSetDevice(gpu_), "cudaSetDevice", reported);
  ops_.reset();  // before the streams it enqueues on go
  for (cudaStream_t s : streams_)
    if (s) report_teardown(cudaStreamSynchronize(s), "cudaStreamSynchronize", reported);
  if (partials_) device_mem_->release(partials_);
  device_mem_.reset();  // cudaFree of every segment
  host_mem_.reset();    // cudaFreeHost of every segment
  for (auto& [p, bytes] : registered_) report_teardown(cudaHostUnregister(p), "cudaHostUnregister", reported);
  for (Ring& r : rings_)
    for (cudaEvent_t e : r.ev)
      if (e) report_teardown(cudaEventDestroy(e), "cudaEventDestroy", reported);
  for (cudaStream_t s : streams_)
    if (s) report_teardown(cudaStreamDestroy(s), "cudaStreamDestroy", reported);
}

Status CudaDevice::make_current() const {
  return check(cudaSetDevice(gpu_), [&] { return fmt::format("cudaSetDevice({})", gpu_); });
}

// --- memory ----------------------------------------------------------------------------------

Result<Buffer> CudaDevice::alloc(size_t bytes, Tier tier, Kind kind) {
  if (tier != Tier::kDevice && tier != Tier::kHost)
    return Status::Invalid("the nvme tier holds files, not buffers: use NvmeStore");
  ZOE_RETURN_IF_ERROR(make_current());
  gpu::CachingAllocator& mem = tier == Tier::kDevice ? *device_mem_ : *host_mem_;
  ZOE_ASSIGN_OR_RETURN(void* p, mem.allocate(bytes, kind));
  Buffer b;
  b.data = p;
  b.bytes = bytes;
  b.tier = tier;
  b.kind = kind;
  return b;
}

void CudaDevice::free(Buffer& b) {
  if (!b.data) return;
  bool ok = false;
  if (b.tier == Tier::kDevice) ok = device_mem_->release(b.data);
  else if (b.tier == Tier::kHost) ok = host_mem_->release(b.data);
  if (!ok)
    fatal(fmt::format("CudaDevice::free: {} is not a {} buffer in use on this device", b.data, tier_name(b.tier)));
  b = Buffer{};
}

uint64_t CudaDevice::unbooked_bytes(Tier tier) const {
  if (tier != Tier::kDevice && tier != Tier::kHost) return 0;
  const gpu::CachingAllocator::Stats s = (tier == Tier::kDevice ? device_mem_ : host_mem_)->stats();
  return s.in_use - s.requested;
}

Status CudaDevice::register_host(void* p, size_t bytes) {
  if (!p || bytes == 0) return Status::Invalid("register_host: empty range");
  ZOE_RETURN_IF_ERROR(make_current());
  std::lock_guard<std::mutex> lock(host_mu_);
  if (registered_.count(p)) return Status::Invalid(fmt::format("register_host: {} is registered already", p));
  ZOE_RETURN_IF_ERROR(check(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                            [&] { return fmt::format("cudaHostRegister of {} bytes at {}", bytes, p); }));
  // Kernels take the host address itself (device.h): the GPU must map the range there.
  void* mapped = nullptr;
  Status s = check(cudaHostGetDevicePointer(&mapped, p, 0), "cudaHostGetDevicePointer");
  if (s.ok() && mapped != p)
    s = Status::Unsupported(fmt::format("GPU {} maps registered host memory at {} instead of its host address {}: "
                                        "kernels cannot read it there", gpu_, mapped, p));
  if (!s.ok()) {
    cudaHostUnregister(p);
    cudaGetLastError();
    return s;
  }
  registered_.emplace(p, bytes);
  return Status::Ok();
}

void CudaDevice::unregister_host(void* p) {
  std::lock_guard<std::mutex> lock(host_mu_);
  auto it = registered_.find(p);
  if (it == registered_.end()) fatal(fmt::format("CudaDevice::unregister_host: {} was not registered", p));
  registered_.erase(it);
  Status s = make_current();
  if (s.ok()) s = check(cudaHostUnregister(p), "cudaHostUnregister");
  if (!s.ok()) std::fprintf(stderr, "zoe: %s\n", s.message().c_str());
}

// --- copies ----------------------------------------------------------------------------------

Status CudaDevice::copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off, size_t bytes,
                              Stream stream) {
  if (dst_off > dst.bytes || bytes > dst.bytes - dst_off || src_off > src.bytes || bytes > src.bytes - src_off)
    return Status::Runtime(fmt::format("copy of {} bytes out of bounds (dst {}+{}, src {}+{})", bytes, dst.bytes,
                                       dst_off, src.bytes, src_off));
  return copy(static_cast<char*>(dst.data) + dst_off, static_cast<const char*>(src.data) + src_off, bytes, stream);
}

Status CudaDevice::copy(void* dst, const void* src, size_t bytes, Stream stream) {
  if (!valid_stream(stream)) return Status::Invalid("copy: unknown stream");
  if (bytes == 0) return Status::Ok();
  if (!dst || !src) return Status::Invalid("copy: null pointer");
  ZOE_RETURN_IF_ERROR(make_current());
  ZOE_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, this->stream(stream)),
                            [&] { return fmt::format("cudaMemcpyAsync of {} bytes", bytes); }));
  copied_[static_cast<int>(stream)] += bytes;
  return Status::Ok();
}

Status CudaDevice::sync_copy(void* dst, const void* src, size_t bytes, Stream copy_stream, const char* what) {
  if (bytes == 0) return Status::Ok();
  if (!dst || !src) return Status::Invalid(fmt::format("{}: null pointer", what));
  ZOE_RETURN_IF_ERROR(make_current());
  ZOE_RETURN_IF_ERROR(wait_on(copy_stream, record(Stream::kCompute)));
  cudaStream_t s = stream(copy_stream);
  ZOE_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s),
                            [&] { return fmt::format("cudaMemcpyAsync ({}) of {} bytes", what, bytes); }));
  copied_[static_cast<int>(copy_stream)] += bytes;
  return check(cudaStreamSynchronize(s), [&] { return fmt::format("{} of {} bytes", what, bytes); });
}

Status CudaDevice::upload(void* dst, const void* host_src, size_t bytes) {
  return sync_copy(dst, host_src, bytes, Stream::kH2D, "upload");
}

Status CudaDevice::download(void* host_dst, const void* src, size_t bytes) {
  return sync_copy(host_dst, src, bytes, Stream::kD2H, "download");
}

Status CudaDevice::zero(void* dst, size_t bytes, Stream stream) {
  if (!valid_stream(stream)) return Status::Invalid("zero: unknown stream");
  if (bytes == 0) return Status::Ok();
  if (!dst) return Status::Invalid("zero: null pointer");
  ZOE_RETURN_IF_ERROR(make_current());
  return check(cudaMemsetAsync(dst, 0, bytes, this->stream(stream)),
               [&] { return fmt::format("cudaMemsetAsync of {} bytes", bytes); });
}

// --- ordering --------------------------------------------------------------------------------

Event CudaDevice::record(Stream stream) {
  if (!valid_stream(stream)) fatal("CudaDevice::record: unknown stream");
  std::lock_guard<std::mutex> lock(events_mu_);
  Ring& r = rings_[stream_index(stream)];
  const uint64_t seq = r.next++;
  const size_t slot = seq % kEventRing;
  Status s = make_current();
  if (s.ok() && !r.ev[slot])
    s = check(cudaEventCreateWithFlags(&r.ev[slot], cudaEventDisableTiming), "cudaEventCreateWithFlags");
  if (s.ok()) s = check(cudaEventRecord(r.ev[slot], streams_[stream_index(stream)]), "cudaEventRecord");
  r.error[slot] = s.ok() ? std::string() : s.message();  // reported by whoever waits for the event
  return Event{stream, seq};
}

Result<cudaEvent_t> CudaDevice::event_of(Event e) {
  if (!valid_stream(e.stream)) return Status::Invalid("event of an unknown stream");
  std::lock_guard<std::mutex> lock(events_mu_);
  const Ring& r = rings_[stream_index(e.stream)];
  if (e.seq >= r.next)
    return Status::Invalid(fmt::format("event {} of stream {} was never recorded", e.seq, stream_index(e.stream)));
  const size_t slot = e.seq % kEventRing;
  if (!r.error[slot].empty()) return Status::Runtime("recording an event failed: " + r.error[slot]);
  return r.ev[slot];
}

Status CudaDevice::wait(Event e) {
  if (e.seq == 0) return Status::Ok();  // nothing recorded
  ZOE_ASSIGN_OR_RETURN(cudaEvent_t ev, event_of(e));
  ZOE_RETURN_IF_ERROR(make_current());
  return check(cudaEventSynchronize(ev), "cudaEventSynchronize");
}

bool CudaDevice::done(Event e) {
  if (e.seq == 0) return true;
  auto ev = event_of(e);
  if (!ev.ok() || !make_current().ok()) return false;
  const cudaError_t r = cudaEventQuery(*ev);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();  // not an error: the work is still queued
  return r == cudaSuccess;
}

Status CudaDevice::wait_on(Stream waiter, Event e) {
  if (!valid_stream(waiter)) return Status::Invalid("wait_on: unknown stream");
  if (e.seq == 0) return Status::Ok();
  ZOE_ASSIGN_OR_RETURN(cudaEvent_t ev, event_of(e));
  if (e.stream == waiter) return Status::Ok();  // a stream runs its work in order
  ZOE_RETURN_IF_ERROR(make_current());
  return check(cudaStreamWaitEvent(stream(waiter), ev, 0), "cudaStreamWaitEvent");
}

// One event per call: recorded on the framework's stream, waited on by each of ours, destroyed
// at once (CUDA releases it when the waits no longer need it).
Status CudaDevice::wait_external(void* stream) {
  ZOE_RETURN_IF_ERROR(make_current());
  cudaEvent_t ev = nullptr;
  ZOE_RETURN_IF_ERROR(check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
  Status st = check(cudaEventRecord(ev, static_cast<cudaStream_t>(stream)), "cudaEventRecord on the caller's stream");
  for (int s = 0; s < kNumStreams && st.ok(); ++s)
    st = check(cudaStreamWaitEvent(streams_[s], ev, 0), "cudaStreamWaitEvent on the caller's stream");
  Status destroyed = check(cudaEventDestroy(ev), "cudaEventDestroy");
  return st.ok() ? destroyed : st;
}

Status CudaDevice::external_wait_on(void* stream, Event e) {
  if (e.seq == 0) return Status::Ok();  // nothing recorded
  ZOE_ASSIGN_OR_RETURN(cudaEvent_t ev, event_of(e));
  ZOE_RETURN_IF_ERROR(make_current());
  return check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev, 0), "cudaStreamWaitEvent on the caller's stream");
}

Status CudaDevice::synchronize() {
  ZOE_RETURN_IF_ERROR(make_current());
  for (int s = 0; s < kNumStreams; ++s)
    ZOE_RETURN_IF_ERROR(
        check(cudaStreamSynchronize(streams_[s]), [&] { return fmt::format("cudaStreamSynchronize (stream {})", s); }));
  return Status::Ok();
}

// --- kernels ---------------------------------------------------------------------------------

Status CudaDevice::accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n, bool accumulate,
                              Stream s) {
  if (!valid_stream(s)) return Status::Invalid("accumulate: unknown stream");
  ZOE_RETURN_IF_ERROR(make_current());
  return gpu::accumulate_cuda(dst, dst_dtype, src, src_dtype, n, accumulate, stream(s), max_blocks_);
}

Status CudaDevice::sum_chunks(void* out, const void* chunks, int n, size_t count, DType dtype) {
  return sum_chunks_on(Stream::kCompute, out, chunks, n, count, dtype);
}

Status CudaDevice::sum_chunks_on(Stream s, void* out, const void* chunks, int n, size_t count, DType dtype) {
  if (!valid_stream(s)) return Status::Invalid("sum_chunks: unknown stream");
  ZOE_RETURN_IF_ERROR(make_current());
  return gpu::sum_chunks_cuda(out, chunks, n, count, dtype, stream(s), max_blocks_);
}

Status CudaDevice::sum_squares(const ArrayView* spans, size_t count, double* out) {
  if (count > 0 && !spans) return Status::Invalid("sum_squares: spans is null");
  ZOE_RETURN_IF_ERROR(make_current());
  std::lock_guard<std::mutex> lock(squares_mu_);
  const uint64_t need = gpu::sum_squares_partials(spans, count);
  if (need > partials_cap_) {
    if (partials_) {  // kernels in flight may still use the old buffer
      ZOE_RETURN_IF_ERROR(check(cudaStreamSynchronize(stream(Stream::kCompute)), "cudaStreamSynchronize"));
      device_mem_->release(partials_);
      partials_ = nullptr;
      partials_cap_ = 0;
    }
    uint64_t cap = 64;  // doubled to fit: a small budget loses no 32 KiB to a few partials
    while (cap < need) cap *= 2;
    ZOE_ASSIGN_OR_RETURN(partials_, device_mem_->allocate(cap * sizeof(double), Kind::kStaging));
    partials_cap_ = cap;
  }
  return gpu::sum_squares_cuda(spans, count, static_cast<double*>(partials_), out, stream(Stream::kCompute),
                               max_blocks_);
}

Status CudaDevice::adam(const AdamHyper& h, const AdamRange* ranges, size_t count, uint64_t* nonfinite) {
  static_assert(sizeof(uint64_t) == sizeof(unsigned long long));
  if (count > 0 && !ranges) return Status::Invalid("adam: ranges is null");
  ZOE_RETURN_IF_ERROR(make_current());
  auto* counter = reinterpret_cast<unsigned long long*>(nonfinite);
  cudaStream_t s = stream(Stream::kCompute);
  if (h.weight_decay == 0.0) return gpu::adam_step_cuda(h, ranges, count, s, counter);
  // Ranges without decay get weight_decay 0, as on the CPU (the constants differ: two launches).
  std::vector<AdamRange> decayed, plain;
  for (size_t i = 0; i < count; ++i) (ranges[i].decay ? decayed : plain).push_back(ranges[i]);
  ZOE_RETURN_IF_ERROR(gpu::adam_step_cuda(h, decayed.data(), decayed.size(), s, counter));
  AdamHyper no_decay = h;
  no_decay.weight_decay = 0.0;
  return gpu::adam_step_cuda(no_decay, plain.data(), plain.size(), s, counter);
}

// The ops' workspaces and scratch come from the budget, booked as the model's activations: the
// scheduler leaves room for them as for the activations (its room() follows their peak), and a
// budget too small for them is an op's error naming the budget, not the GPU's own out-of-memory.
ModelOps& CudaDevice::ops() {
  std::call_once(ops_once_, [this] {
    gpu::RawMemory memory{[this](size_t n) { return device_mem_->allocate(n, Kind::kActivation); },
                          [this](void* p) { device_mem_->release(p); }};
    if (make_current().ok()) ops_ = gpu::make_cuda_model_ops(stream(Stream::kCompute), allow_tf32_, std::move(memory));
  });
  if (!ops_) fatal(fmt::format("no CUDA model ops for GPU {}: cudaSetDevice failed or make_cuda_model_ops returned none", gpu_));
  return *ops_;
}

// --- factories -------------------------------------------------------------------------------

Result<std::unique_ptr<Device>> make_cuda_device(int gpu_index, size_t device_budget, size_t host_budget,
                                                 bool allow_tf32) {
  auto needs_gpu = [](const std::string& why) {
    return Status::Invalid(fmt::format("config key 'zoe.device': \"cuda\" needs a GPU: {}", why));
  };
  std::string why;
  const std::vector<gpu::GpuInfo> gpus = gpu::list_gpus(&why);
  if (gpus.empty()) return needs_gpu(why);
  if (gpu_index < 0 || static_cast<size_t>(gpu_index) >= gpus.size())
    return needs_gpu(fmt::format("GPU {} was asked for but {} {} visible", gpu_index, gpus.size(),
                                 gpus.size() == 1 ? "is" : "are"));
  if (cudaError_t e = cudaSetDevice(gpu_index); e != cudaSuccess) {
    cudaGetLastError();
    return needs_gpu(fmt::format("cudaSetDevice({}): {}", gpu_index, cuda_error(e)));
  }
  if (!gpu::smoke_kernel(&why)) {
    cudaGetLastError();
    return needs_gpu(fmt::format("GPU {} ({}) cannot run zoe's kernels: {}", gpu_index, gpus[gpu_index].name, why));
  }
  ZOE_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> d, CudaDevice::create(gpu_index, device_budget, host_budget, allow_tf32));
  return Result<std::unique_ptr<Device>>(std::unique_ptr<Device>(std::move(d)));
}

int local_gpu_index() {
  const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!s) s = std::getenv("MPI_LOCALRANKID");
  if (!s) s = std::getenv("SLURM_LOCALID");
  const int local = s ? std::max(0, std::atoi(s)) : 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return 0;
  }
  return local % n;
}

}  // namespace zoe

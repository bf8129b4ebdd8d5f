// The device interface: buffers on tiers, asynchronous copies and kernels ordered on streams and
// events, and the few kernels the engine runs. Two implementations: CpuDevice (a budgeted host
// arena stands in for device memory; `cpu-strict` makes that memory untouchable by host code
// outside Device calls) and CudaDevice. The engine never asks which one it runs on.
//
// Memory rules, which the strict CPU device enforces:
//   - device memory (Tier::kDevice) is touched only by Device calls and by the Comm paired with
//     the device; host code moves it with upload/download;
//   - kernels take device memory, or host memory the device can reach: Tier::kHost buffers from
//     alloc() (pinned) and ranges given to register_host() (the NVMe tier's pinned pool);
//   - work is enqueued on a stream and runs in order there; a stream waits for another's work
//     with wait_on(); the host waits with wait() or synchronize().
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "zoe/dtype.h"
#include "zoe/ledger.h"
#include "zoe/status.h"

namespace zoe {

class ModelOps;

struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
  Tier tier = Tier::kDevice;
  Kind kind = Kind::kStaging;
  explicit operator bool() const { return data != nullptr; }
  template <typename T> T* as() const { return static_cast<T*>(data); }
};

// Streams order work: compute kernels, host->device copies, device->host copies, collectives,
// and the collectives of the engine's communication thread (a duplicate communicator's, ordered
// against compute by events only: comm/comm.h).
enum class Stream : uint8_t { kCompute = 0, kH2D = 1, kD2H = 2, kComm = 3, kCommThread = 4 };
inline constexpr int kNumStreams = 5;

struct Event {
  Stream stream = Stream::kCompute;
  uint64_t seq = 0;  // work items on `stream` up to seq are done once the event completes
};

// Parameters of the fused Adam kernel; see kernels/adam.h for the exact semantics.
struct AdamHyper;
struct AdamRange;

// A flat typed array of device memory (or device-reachable host memory): n elements of dtype at
// x (an input of sum_squares).
struct ArrayView {
  const void* x = nullptr;
  DType dtype = DType::kF32;
  size_t n = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // Where its memory is, for frameworks that exchange tensors (DLPack's device): host memory, or
  // the GPU of this index.
  struct Place {
    bool gpu = false;
    int index = 0;
  };
  virtual Place place() const { return {}; }

  // Allocates `bytes` on `tier` within that tier's budget, booked in the ledger under `kind`:
  // kDevice is device memory, kHost pinned host memory (async copies, kernels may read it).
  virtual Result<Buffer> alloc(size_t bytes, Tier tier, Kind kind) = 0;
  virtual void free(Buffer& b) = 0;
  // Bytes of `tier`'s budget that the blocks in use take beyond what the ledger books (their
  // rounding): the scheduler counts them as used. 0 where that rounding is negligible.
  virtual uint64_t unbooked_bytes(Tier tier) const { return 0; }
  // Host memory allocated elsewhere (the NVMe tier's pinned pool) becomes usable like kHost
  // buffers until unregistered.
  virtual Status register_host(void* p, size_t bytes) = 0;
  virtual void unregister_host(void* p) = 0;

  // Copies bytes between any two buffers, in order on `stream`.
  virtual Status copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off,
                            size_t bytes, Stream stream) = 0;
  // The same between raw addresses of device or device-reachable host memory.
  virtual Status copy(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  // Synchronous: any host memory -> device memory, and back. Each waits for the compute stream
  // first, so what kernels enqueued before is what moves.
  virtual Status upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status download(void* host_dst, const void* src, size_t bytes) = 0;
  // Bytes the copies above have moved on `stream` since the device was made (upload on kH2D,
  // download on kD2H): what a bench holds against the link's rate. 0 where a device does not count.
  virtual uint64_t copied_bytes(Stream /*stream*/) const { return 0; }
  virtual Status zero(void* dst, size_t bytes, Stream stream = Stream::kCompute) = 0;

  virtual Event record(Stream stream) = 0;
  virtual Status wait(Event e) = 0;                  // the host waits
  // Whether the work up to e has run, without waiting (false after an error too: wait reports it).
  // The default waits: a device that can ask without waiting says so.
  virtual bool done(Event e) { return wait(e).ok(); }
  virtual Status wait_on(Stream waiter, Event e) = 0;  // later work on `waiter` waits for e
  virtual Status synchronize() = 0;                  // every stream drained
  // Later work on every stream of this device waits for what `stream` (a native stream of this
  // device's runtime: a cudaStream_t of its GPU) has queued so far, so that a framework's kernels
  // that still read or write a buffer are done before the engine reuses it. The CPU device has
  // nothing to wait for: a framework's CPU ops are done when they return.
  virtual Status wait_external(void* stream) {
    (void)stream;
    return Status::Ok();
  }
  // The other way: later work queued on the framework's `stream` waits for e (an event, so the
  // host goes on), for memory the framework reads or reuses after the engine's work. A device
  // without native streams waits on the host.
  virtual Status external_wait_on(void* stream, Event e) {
    (void)stream;
    return wait(e);
  }

  // Kernels the engine itself runs, on the compute stream (the model's are in ops()).
  // dst[i] = (accumulate ? dst[i] : 0) + src[i], summed in fp32, stored as dst_dtype; on `stream`
  // (a communication thread's reductions land on theirs).
  virtual Status accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                            bool accumulate, Stream stream = Stream::kCompute) = 0;
  // out[i] = sum over k = 0..n-1, in that order and in fp32, of chunk k's element i; the chunks
  // (`count` elements of dtype each) lie back to back. The reduction of every Comm.
  virtual Status sum_chunks(void* out, const void* chunks, int n, size_t count, DType dtype) = 0;
  // *out (device memory) += the sum of squares of every span, in float64 and a fixed order
  // (independent of threads or launch shapes).
  virtual Status sum_squares(const ArrayView* spans, size_t count, double* out) = 0;
  // dst = src rounded to dst_dtype (accumulate(dst, dst_dtype, src, kF32, n, false)), then *sumsq
  // (device memory) += the sum of squares of dst's n elements, bitwise sum_squares over that one
  // span: a gradient's share of the norm, made as it goes into its shard. This runs the two in
  // turn; the CPU device does both in one pass, each block summed while it is in cache.
  virtual Status convert_sum_squares(void* dst, DType dst_dtype, const float* src, size_t n, double* sumsq) {
    ZOE_RETURN_IF_ERROR(accumulate(dst, dst_dtype, src, DType::kF32, n, false));
    const ArrayView span{dst, dst_dtype, n};
    return sum_squares(&span, 1, sumsq);
  }
  // Fused Adam over every range (see kernels/adam.h; a range with decay false gets no weight decay);
  // adds the count of non-finite gradient elements met to *nonfinite (device memory).
  virtual Status adam(const AdamHyper& h, const AdamRange* ranges, size_t count, uint64_t* nonfinite) = 0;

  // The compute kernels models are written in (GEMMs, norms, attention, ...), on this device.
  virtual ModelOps& ops() = 0;

  Ledger& ledger() { return ledger_; }
  const Ledger& ledger() const { return ledger_; }

  // The device's memory as host code may see it, for the Comm paired with the device (MPI moves
  // the CPU device's bytes itself): while a HostAccess lives, the strict CPU device lets host
  // code touch device memory. No-op elsewhere.
  class HostAccess {
   public:
    explicit HostAccess(Device& d) : d_(d) { d_.begin_host_access(); }
    ~HostAccess() { d_.end_host_access(); }
    HostAccess(const HostAccess&) = delete;
    HostAccess& operator=(const HostAccess&) = delete;

   private:
    Device& d_;
  };

 protected:
  virtual void begin_host_access() {}
  virtual void end_host_access() {}
  Ledger ledger_;
};

// n elements of `dtype` at src (device memory) into host fp32: a plain download for fp32, else
// converted on the device through a staging buffer first.
Status download_f32(Device& d, float* host_dst, const void* src, DType dtype, size_t n);

}  // namespace zoe

// The device interface: buffers on tiers, asynchronous copies ordered by events, and the few
// kernels the engine runs. Two implementations: CpuDevice (a budgeted host arena stands in for
// device memory) and, later, CudaDevice. The engine never asks which one it runs on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "zoe/dtype.h"
#include "zoe/ledger.h"
#include "zoe/status.h"

namespace zoe {

struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
  Tier tier = Tier::kDevice;
  Kind kind = Kind::kStaging;
  explicit operator bool() const { return data != nullptr; }
  template <typename T> T* as() const { return static_cast<T*>(data); }
};

// Streams order work: 0 computes, 1 copies host->device, 2 copies device->host.
enum class Stream : uint8_t { kCompute = 0, kH2D = 1, kD2H = 2 };
inline constexpr int kNumStreams = 3;

struct Event {
  Stream stream = Stream::kCompute;
  uint64_t seq = 0;  // work items on `stream` up to seq are done once the event completes
};

// Parameters of the fused Adam kernel; see cpu/adam.h for the exact semantics.
struct AdamHyper;
struct AdamRange;

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;

  // Allocates `bytes` on `tier` (kDevice or kHost) within that tier's budget; accounted in the
  // ledger under `kind`. Never returns uninitialised pages to the hot path twice: freed memory
  // is reused.
  virtual Result<Buffer> alloc(size_t bytes, Tier tier, Kind kind) = 0;
  virtual void free(Buffer& b) = 0;

  // Copies bytes between any two buffers, in order on `stream`.
  virtual Status copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off,
                            size_t bytes, Stream stream) = 0;
  // Host memory -> device-owned memory, synchronous (initial values, checkpoint loads).
  virtual Status upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status zero(void* dst, size_t bytes) = 0;
  virtual Event record(Stream stream) = 0;
  virtual Status wait(Event e) = 0;           // the host waits
  virtual Status synchronize() = 0;           // every stream drained

  // Kernels the engine itself runs (the model's kernels live with the model).
  // dst[i] = (accumulate ? dst[i] : 0) + src[i], summed in fp32, stored as dst_dtype.
  virtual Status accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                            bool accumulate) = 0;
  // Sum of squares of x[0, n) in float64, in a fixed order (independent of threads).
  virtual Result<double> sum_squares(const void* x, DType dtype, size_t n) = 0;
  // Fused Adam over one range; returns the count of non-finite gradients met.
  virtual Result<size_t> adam(const AdamHyper& h, const AdamRange& r) = 0;

  Ledger& ledger() { return ledger_; }
  const Ledger& ledger() const { return ledger_; }

 protected:
  Ledger ledger_;
};

}  // namespace zoe

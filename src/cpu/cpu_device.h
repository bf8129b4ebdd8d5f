// The CPU device: "device memory" is an Arena capped by zoe.device_memory_budget, host memory is
// malloc'd within zoe.host_memory_budget. Copy streams are worker threads, so copies overlap
// compute exactly as DMA engines would; the compute and comm streams run on the calling thread.
//
// Strict mode (`zoe.device: cpu-strict`): the arena is PROT_NONE outside Device calls (see
// memory_fence.h), and every kernel checks that its pointers are device memory or host memory a
// GPU could reach (kHost buffers, registered ranges), so CPU runs catch what would break on a GPU.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cpu/arena.h"
#include "cpu/memory_fence.h"
#include "zoe/device.h"

namespace zoe {

class CpuDevice final : public Device {
 public:
  CpuDevice(size_t device_budget, size_t host_budget, bool strict = false);
  ~CpuDevice() override;
  const char* name() const override { return strict_ ? "cpu-strict" : "cpu"; }
  bool strict() const { return strict_; }
  // errno of reserving the device budget's address range, 0 when it was reserved.
  int arena_map_error() const { return arena_.map_error(); }

  Result<Buffer> alloc(size_t bytes, Tier tier, Kind kind) override;
  void free(Buffer& b) override;
  Status register_host(void* p, size_t bytes) override;
  void unregister_host(void* p) override;
  Status copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off, size_t bytes,
                    Stream stream) override;
  Status copy(void* dst, const void* src, size_t bytes, Stream stream) override;
  Status upload(void* dst, const void* host_src, size_t bytes) override;
  Status download(void* host_dst, const void* src, size_t bytes) override;
  Status zero(void* dst, size_t bytes, Stream stream = Stream::kCompute) override;
  Event record(Stream stream) override;
  bool done(Event e) override;
  Status wait(Event e) override;
  Status wait_on(Stream waiter, Event e) override;
  Status synchronize() override;

  Status accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                    bool accumulate, Stream stream = Stream::kCompute) override;
  Status sum_chunks(void* out, const void* chunks, int n, size_t count, DType dtype) override;
  Status sum_squares(const ArrayView* spans, size_t count, double* out) override;
  Status convert_sum_squares(void* dst, DType dst_dtype, const float* src, size_t n, double* sumsq) override;
  Status adam(const AdamHyper& h, const AdamRange* ranges, size_t count, uint64_t* nonfinite) override;
  ModelOps& ops() override { return *ops_; }

  // Strict mode: an error naming `what` unless [p, p + bytes) is device memory or host memory
  // the device can reach (always Ok otherwise). The model ops use it too.
  Status check_reachable(const void* p, size_t bytes, const char* what) const;
  // The fence over device memory (null unless strict): device work runs inside an Open of it.
  MemoryFence* fence() const { return fence_.get(); }

 protected:
  void begin_host_access() override;
  void end_host_access() override;

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> work;
    uint64_t submitted = 0, done = 0;
    bool stop = false;
    std::thread worker;
  };
  void run_queue(Queue& q);
  bool asynchronous(Stream s) const { return s == Stream::kH2D || s == Stream::kD2H; }
  void enqueue(Stream s, std::function<void()> fn);
  void run_on(Stream s, std::function<void()> fn);

  bool strict_;
  Arena arena_;
  std::unique_ptr<MemoryFence> fence_;
  size_t host_budget_;
  std::atomic<size_t> host_in_use_{0};
  mutable std::mutex host_mu_;
  std::map<const char*, size_t> reachable_host_;  // kHost buffers and registered ranges (strict)
  std::unique_ptr<Queue> queues_[kNumStreams];
  std::unique_ptr<ModelOps> ops_;
};

}  // namespace zoe

// The CPU device: "device memory" is an Arena capped by zoe.device_memory_budget, host memory is
// malloc'd within zoe.host_memory_budget. Copy streams are worker threads, so copies overlap
// compute exactly as DMA engines would; the compute stream runs on the calling thread.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "cpu/arena.h"
#include "zoe/device.h"

namespace zoe {

class CpuDevice final : public Device {
 public:
  CpuDevice(size_t device_budget, size_t host_budget);
  ~CpuDevice() override;
  const char* name() const override { return "cpu"; }

  Result<Buffer> alloc(size_t bytes, Tier tier, Kind kind) override;
  void free(Buffer& b) override;
  Status copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off, size_t bytes,
                    Stream stream) override;
  Status upload(void* dst, const void* host_src, size_t bytes) override;
  Status zero(void* dst, size_t bytes) override;
  Event record(Stream stream) override;
  Status wait(Event e) override;
  Status synchronize() override;

  Status accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                    bool accumulate) override;
  Result<double> sum_squares(const void* x, DType dtype, size_t n) override;
  Result<size_t> adam(const AdamHyper& h, const AdamRange& r) override;

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

  Arena arena_;
  size_t host_budget_;
  std::atomic<size_t> host_in_use_{0};
  std::unique_ptr<Queue> queues_[kNumStreams];
};

}  // namespace zoe

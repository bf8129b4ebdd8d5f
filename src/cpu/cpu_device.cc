#include "cpu/cpu_device.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "cpu/adam.h"

namespace zoe {

namespace {
// Fixed block size for reductions: partial sums per block, then summed in block order, so the
// result does not depend on how many threads ran.
constexpr size_t kReduceBlock = 1 << 16;
constexpr size_t kGrain = 1 << 15;
}  // namespace

CpuDevice::CpuDevice(size_t device_budget, size_t host_budget)
    : arena_(device_budget), host_budget_(host_budget) {
  for (int s = 0; s < kNumStreams; ++s) {
    queues_[s] = std::make_unique<Queue>();
    if (s != static_cast<int>(Stream::kCompute))
      queues_[s]->worker = std::thread([this, s] { run_queue(*queues_[s]); });
  }
}

CpuDevice::~CpuDevice() {
  for (auto& q : queues_) {
    {
      std::lock_guard<std::mutex> l(q->mu);
      q->stop = true;
    }
    q->cv.notify_all();
    if (q->worker.joinable()) q->worker.join();
  }
}

void CpuDevice::run_queue(Queue& q) {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> l(q.mu);
      q.cv.wait(l, [&] { return q.stop || !q.work.empty(); });
      if (q.work.empty()) return;
      fn = std::move(q.work.front());
      q.work.pop_front();
    }
    fn();
    {
      std::lock_guard<std::mutex> l(q.mu);
      ++q.done;
    }
    q.cv.notify_all();
  }
}

Result<Buffer> CpuDevice::alloc(size_t bytes, Tier tier, Kind kind) {
  Buffer b;
  b.bytes = bytes;
  b.tier = tier;
  b.kind = kind;
  if (tier == Tier::kDevice) {
    ZOE_ASSIGN_OR_RETURN(b.data, arena_.allocate(bytes));
  } else if (tier == Tier::kHost) {
    if (host_in_use_ + bytes > host_budget_)
      return Status::OutOfMemory(fmt::format(
          "host memory budget exhausted: asked for {} bytes, {} of {} in use (raise zoe.host_memory_budget)",
          bytes, host_in_use_.load(), host_budget_));
    b.data = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (!b.data) return Status::OutOfMemory(fmt::format("host allocation of {} bytes failed", bytes));
    host_in_use_ += bytes;
  } else {
    return Status::Invalid("the nvme tier holds files, not buffers: use NvmeStore");
  }
  ledger_.add(tier, kind, bytes);
  return b;
}

void CpuDevice::free(Buffer& b) {
  if (!b.data) return;
  if (b.tier == Tier::kDevice) {
    arena_.release(b.data);
  } else {
    std::free(b.data);
    host_in_use_ -= b.bytes;
  }
  ledger_.sub(b.tier, b.kind, b.bytes);
  b = Buffer{};
}

Status CpuDevice::copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off,
                             size_t bytes, Stream stream) {
  if (dst_off + bytes > dst.bytes || src_off + bytes > src.bytes)
    return Status::Runtime(fmt::format("copy of {} bytes out of bounds (dst {}+{}, src {}+{})", bytes,
                                       dst.bytes, dst_off, src.bytes, src_off));
  char* d = static_cast<char*>(dst.data) + dst_off;
  const char* s = static_cast<const char*>(src.data) + src_off;
  if (stream == Stream::kCompute) {
    std::memcpy(d, s, bytes);
    return Status::Ok();
  }
  Queue& q = *queues_[static_cast<int>(stream)];
  {
    std::lock_guard<std::mutex> l(q.mu);
    q.work.emplace_back([d, s, bytes] { std::memcpy(d, s, bytes); });
    ++q.submitted;
  }
  q.cv.notify_all();
  return Status::Ok();
}

Status CpuDevice::upload(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
  return Status::Ok();
}

Status CpuDevice::zero(void* dst, size_t bytes) {
  std::memset(dst, 0, bytes);
  return Status::Ok();
}

Event CpuDevice::record(Stream stream) {
  Queue& q = *queues_[static_cast<int>(stream)];
  std::lock_guard<std::mutex> l(q.mu);
  return Event{stream, q.submitted};
}

Status CpuDevice::wait(Event e) {
  Queue& q = *queues_[static_cast<int>(e.stream)];
  std::unique_lock<std::mutex> l(q.mu);
  q.cv.wait(l, [&] { return q.done >= e.seq || e.stream == Stream::kCompute; });
  return Status::Ok();
}

Status CpuDevice::synchronize() {
  for (int s = 0; s < kNumStreams; ++s) ZOE_RETURN_IF_ERROR(wait(record(static_cast<Stream>(s))));
  return Status::Ok();
}

Status CpuDevice::accumulate(void* dst, DType t, const void* src, DType st, size_t n, bool accumulate) {
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, kGrain), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t i = r.begin(); i < r.end(); ++i) {
      float v = load_as_f32(src, st, i);
      if (accumulate) v = load_as_f32(dst, t, i) + v;
      store_from_f32(dst, t, i, v);
    }
  });
  return Status::Ok();
}

Result<double> CpuDevice::sum_squares(const void* x, DType t, size_t n) {
  size_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partial(blocks, 0.0);
  tbb::parallel_for(size_t{0}, blocks, [&](size_t b) {
    size_t lo = b * kReduceBlock, hi = std::min(n, lo + kReduceBlock);
    double s = 0;
    for (size_t i = lo; i < hi; ++i) {
      double v = load_as_f32(x, t, i);
      s += v * v;
    }
    partial[b] = s;
  });
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

Result<size_t> CpuDevice::adam(const AdamHyper& h, const AdamRange& r) {
  return adam_step(h, r, best_isa());
}

}  // namespace zoe

#include "cpu/cpu_device.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "comm/comm.h"
#include "common/profiler.h"
#include "kernels/adam.h"
#include "kernels/convert.h"
#include "kernels/sum_squares.h"
#include "cpu/cpu_model_ops.h"

namespace zoe {

namespace {
// Fixed block size for reductions: partial sums per block, then summed in block order, so the
// result does not depend on how many threads ran.
constexpr size_t kReduceBlock = 1 << 16;
constexpr size_t kGrain = 1 << 15;
}  // namespace

CpuDevice::CpuDevice(size_t device_budget, size_t host_budget, bool strict)
    : strict_(strict), arena_(device_budget), host_budget_(host_budget) {
  if (strict_) fence_ = std::make_unique<MemoryFence>(arena_.base(), arena_.capacity());
  for (int s = 0; s < kNumStreams; ++s) {
    queues_[s] = std::make_unique<Queue>();
    if (asynchronous(static_cast<Stream>(s)))
      queues_[s]->worker = std::thread([this, s] {
        Profiler::name_thread(s == static_cast<int>(Stream::kH2D) ? "h2d copies" : "d2h copies");
        run_queue(*queues_[s]);
      });
  }
  ops_ = make_cpu_model_ops(*this);
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

void CpuDevice::enqueue(Stream s, std::function<void()> fn) {
  Queue& q = *queues_[static_cast<int>(s)];
  {
    std::lock_guard<std::mutex> l(q.mu);
    q.work.emplace_back(std::move(fn));
    ++q.submitted;
  }
  q.cv.notify_all();
}

// Work on a copy stream runs on its worker, on the others at once; either way inside the fence.
void CpuDevice::run_on(Stream s, std::function<void()> fn) {
  // On a copy stream's worker the copy is its own row of the trace (h2d, d2h).
  auto fenced = [f = fence_.get(), fn = std::move(fn), s, async = asynchronous(s)] {
    MemoryFence::Open o(f);
    if (!async || !Profiler::get().tracing()) return fn();
    const char* cat = s == Stream::kH2D ? "h2d" : "d2h";
    Span span(cat, cat, Bucket::kNone);
    fn();
  };
  if (asynchronous(s))
    enqueue(s, std::move(fenced));
  else
    fenced();
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
    ZOE_RETURN_IF_ERROR(register_host(b.data, std::max<size_t>(bytes, 1)));
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
    unregister_host(b.data);
    std::free(b.data);
    host_in_use_ -= b.bytes;
  }
  ledger_.sub(b.tier, b.kind, b.bytes);
  b = Buffer{};
}

Status CpuDevice::register_host(void* p, size_t bytes) {
  std::lock_guard<std::mutex> l(host_mu_);
  reachable_host_[static_cast<const char*>(p)] = bytes;
  return Status::Ok();
}

void CpuDevice::unregister_host(void* p) {
  std::lock_guard<std::mutex> l(host_mu_);
  reachable_host_.erase(static_cast<const char*>(p));
}

Status CpuDevice::check_reachable(const void* p, size_t bytes, const char* what) const {
  if (!strict_ || bytes == 0) return Status::Ok();
  auto c = static_cast<const char*>(p);
  if (arena_.contains(c) && arena_.contains(c + bytes - 1)) return Status::Ok();
  {
    std::lock_guard<std::mutex> l(host_mu_);
    auto it = reachable_host_.upper_bound(c);
    if (it != reachable_host_.begin() && c + bytes <= std::prev(it)->first + std::prev(it)->second)
      return Status::Ok();
  }
  return Status::Runtime(fmt::format(
      "cpu-strict: {} at {} ({} bytes) is neither device memory nor host memory the device can reach (a kHost "
      "buffer or a registered range): on a GPU this would fail",
      what, p, bytes));
}

void CpuDevice::begin_host_access() {
  if (fence_) fence_->open();
}
void CpuDevice::end_host_access() {
  if (fence_) fence_->close();
}

Status CpuDevice::copy_async(const Buffer& dst, size_t dst_off, const Buffer& src, size_t src_off, size_t bytes,
                             Stream stream) {
  if (dst_off + bytes > dst.bytes || src_off + bytes > src.bytes)
    return Status::Runtime(fmt::format("copy of {} bytes out of bounds (dst {}+{}, src {}+{})", bytes, dst.bytes,
                                       dst_off, src.bytes, src_off));
  return copy(static_cast<char*>(dst.data) + dst_off, static_cast<const char*>(src.data) + src_off, bytes, stream);
}

Status CpuDevice::copy(void* dst, const void* src, size_t bytes, Stream stream) {
  ZOE_RETURN_IF_ERROR(check_reachable(dst, bytes, "copy destination"));
  ZOE_RETURN_IF_ERROR(check_reachable(src, bytes, "copy source"));
  run_on(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  return Status::Ok();
}

Status CpuDevice::upload(void* dst, const void* host_src, size_t bytes) {
  ZOE_RETURN_IF_ERROR(check_reachable(dst, bytes, "upload destination"));
  if (bytes == 0) return Status::Ok();  // an empty vector's data() may be null: memcpy's is UB
  MemoryFence::Open o(fence_.get());
  std::memcpy(dst, host_src, bytes);
  return Status::Ok();
}

Status CpuDevice::download(void* host_dst, const void* src, size_t bytes) {
  ZOE_RETURN_IF_ERROR(check_reachable(src, bytes, "download source"));
  if (bytes == 0) return Status::Ok();  // as upload
  MemoryFence::Open o(fence_.get());
  std::memcpy(host_dst, src, bytes);
  return Status::Ok();
}

Status CpuDevice::zero(void* dst, size_t bytes, Stream stream) {
  ZOE_RETURN_IF_ERROR(check_reachable(dst, bytes, "zero destination"));
  run_on(stream, [dst, bytes] { std::memset(dst, 0, bytes); });
  return Status::Ok();
}

Event CpuDevice::record(Stream stream) {
  if (!asynchronous(stream)) return Event{stream, 0};  // work there is done when enqueued
  Queue& q = *queues_[static_cast<int>(stream)];
  std::lock_guard<std::mutex> l(q.mu);
  return Event{stream, q.submitted};
}

bool CpuDevice::done(Event e) {
  if (!asynchronous(e.stream)) return true;
  Queue& q = *queues_[static_cast<int>(e.stream)];
  std::lock_guard<std::mutex> l(q.mu);
  return q.done >= e.seq;
}

Status CpuDevice::wait(Event e) {
  if (!asynchronous(e.stream)) return Status::Ok();
  Queue& q = *queues_[static_cast<int>(e.stream)];
  std::unique_lock<std::mutex> l(q.mu);
  q.cv.wait(l, [&] { return q.done >= e.seq; });
  return Status::Ok();
}

// A synchronous stream (compute, comm) waits by having the host wait; a copy stream waits by
// running a wait as its next work item.
Status CpuDevice::wait_on(Stream waiter, Event e) {
  if (!asynchronous(e.stream) || waiter == e.stream) return Status::Ok();
  if (!asynchronous(waiter)) return wait(e);
  enqueue(waiter, [this, e] { (void)wait(e); });
  return Status::Ok();
}

Status CpuDevice::synchronize() {
  for (int s = 0; s < kNumStreams; ++s) ZOE_RETURN_IF_ERROR(wait(record(static_cast<Stream>(s))));
  return Status::Ok();
}

namespace {

// The element type of a dtype, and conversions chosen at compile time: a loop per (dst, src)
// pair has no per-element switch and vectorises (the conversions are integer bit operations).
template <DType T> struct Elem { using type = uint16_t; };
template <> struct Elem<DType::kF32> { using type = float; };

template <DType T>
inline float to_f32(typename Elem<T>::type x) {
  if constexpr (T == DType::kF32) return x;
  else if constexpr (T == DType::kBF16) return bf16_to_f32(x);
  else return f16_to_f32(x);
}

template <DType T>
inline typename Elem<T>::type from_f32(float v) {
  if constexpr (T == DType::kF32) return v;
  else if constexpr (T == DType::kBF16) return f32_to_bf16(v);
  else return f32_to_f16(v);
}

template <DType D, DType S>
void accumulate_range(void* dst, const void* src, size_t a, size_t b, bool acc) {
  auto* d = static_cast<typename Elem<D>::type*>(dst);
  const auto* s = static_cast<const typename Elem<S>::type*>(src);
  if (acc) {
    for (size_t i = a; i < b; ++i) d[i] = from_f32<D>(to_f32<D>(d[i]) + to_f32<S>(s[i]));
  } else {
    for (size_t i = a; i < b; ++i) d[i] = from_f32<D>(to_f32<S>(s[i]));
  }
}

template <DType D>
void accumulate_range(void* dst, const void* src, DType st, size_t a, size_t b, bool acc) {
  switch (st) {
    case DType::kF32: return accumulate_range<D, DType::kF32>(dst, src, a, b, acc);
    case DType::kBF16: return accumulate_range<D, DType::kBF16>(dst, src, a, b, acc);
    default: return accumulate_range<D, DType::kF16>(dst, src, a, b, acc);
  }
}

void accumulate_range(void* dst, DType t, const void* src, DType st, size_t a, size_t b, bool acc) {
  switch (t) {
    case DType::kF32: return accumulate_range<DType::kF32>(dst, src, st, a, b, acc);
    case DType::kBF16: return accumulate_range<DType::kBF16>(dst, src, st, a, b, acc);
    default: return accumulate_range<DType::kF16>(dst, src, st, a, b, acc);
  }
}

}  // namespace

Status CpuDevice::accumulate(void* dst, DType t, const void* src, DType st, size_t n, bool accumulate,
                             Stream stream) {
  ZOE_RETURN_IF_ERROR(check_reachable(dst, n * dtype_size(t), "accumulate destination"));
  ZOE_RETURN_IF_ERROR(check_reachable(src, n * dtype_size(st), "accumulate source"));
  run_on(stream, [=] {
    if (!accumulate && t == st) {  // x to fp32 and back is x (NaNs aside): a copy
      std::memcpy(dst, src, n * dtype_size(t));
      return;
    }
    if (!accumulate && st == DType::kF32) {  // a gradient into its low-precision shard: the SIMD kernel
      const Isa isa = best_isa();
      tbb::parallel_for(tbb::blocked_range<size_t>(0, n, kGrain), [&](const tbb::blocked_range<size_t>& r) {
        convert_from_f32(t, dst, static_cast<const float*>(src), r.begin(), r.end(), isa);
      });
      return;
    }
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, kGrain), [&](const tbb::blocked_range<size_t>& r) {
      accumulate_range(dst, t, src, st, r.begin(), r.end(), accumulate);
    });
  });
  return Status::Ok();
}

Status CpuDevice::sum_chunks(void* out, const void* chunks, int n, size_t count, DType dtype) {
  ZOE_RETURN_IF_ERROR(check_reachable(out, count * dtype_size(dtype), "sum_chunks output"));
  ZOE_RETURN_IF_ERROR(check_reachable(chunks, n * count * dtype_size(dtype), "sum_chunks input"));
  MemoryFence::Open o(fence_.get());
  sum_chunks_in_order(chunks, n, count, dtype, out);
  return Status::Ok();
}

Status CpuDevice::sum_squares(const ArrayView* spans, size_t count, double* out) {
  ZOE_RETURN_IF_ERROR(check_reachable(out, sizeof(double), "sum_squares output"));
  for (size_t k = 0; k < count; ++k)
    ZOE_RETURN_IF_ERROR(check_reachable(spans[k].x, spans[k].n * dtype_size(spans[k].dtype), "sum_squares input"));
  MemoryFence::Open o(fence_.get());
  const Isa isa = best_isa();  // every ISA gives the same bits (kernels/sum_squares.h)
  double total = 0;
  for (size_t k = 0; k < count; ++k) {
    const ArrayView& sp = spans[k];
    size_t blocks = (sp.n + kReduceBlock - 1) / kReduceBlock;
    std::vector<double> partial(blocks, 0.0);
    tbb::parallel_for(size_t{0}, blocks, [&](size_t b) {
      size_t lo = b * kReduceBlock, hi = std::min(sp.n, lo + kReduceBlock);
      partial[b] = sum_squares_range(sp.dtype, sp.x, lo, hi, isa);
    });
    double s = 0;
    for (double p : partial) s += p;
    total += s;
  }
  *out += total;
  return Status::Ok();
}

// One pass: each block of sum_squares' grid is converted, then summed while it is in cache; the
// partials add up in the same order as sum_squares' over the one span (the same bits).
Status CpuDevice::convert_sum_squares(void* dst, DType t, const float* src, size_t n, double* sumsq) {
  ZOE_RETURN_IF_ERROR(check_reachable(dst, n * dtype_size(t), "convert_sum_squares destination"));
  ZOE_RETURN_IF_ERROR(check_reachable(src, n * sizeof(float), "convert_sum_squares source"));
  ZOE_RETURN_IF_ERROR(check_reachable(sumsq, sizeof(double), "convert_sum_squares output"));
  MemoryFence::Open o(fence_.get());
  const Isa isa = best_isa();
  std::vector<double> partial((n + kReduceBlock - 1) / kReduceBlock, 0.0);
  tbb::parallel_for(size_t{0}, partial.size(), [&](size_t b) {
    const size_t lo = b * kReduceBlock, hi = std::min(n, lo + kReduceBlock);
    convert_from_f32(t, dst, src, lo, hi, isa);
    partial[b] = sum_squares_range(t, dst, lo, hi, isa);
  });
  double s = 0;
  for (double p : partial) s += p;
  *sumsq += s;
  return Status::Ok();
}

Status CpuDevice::adam(const AdamHyper& h, const AdamRange* ranges, size_t count, uint64_t* nonfinite) {
  ZOE_RETURN_IF_ERROR(check_reachable(nonfinite, sizeof(uint64_t), "adam counter"));
  for (size_t k = 0; k < count; ++k) {
    const AdamRange& r = ranges[k];
    ZOE_RETURN_IF_ERROR(check_reachable(r.grad, r.n * dtype_size(r.grad_dtype), "adam gradient"));
    for (const float* p : {r.master, r.exp_avg, r.exp_avg_sq})
      ZOE_RETURN_IF_ERROR(check_reachable(p, r.n * 4, "adam state"));
    if (r.param_out)
      ZOE_RETURN_IF_ERROR(check_reachable(r.param_out, r.n * dtype_size(r.param_dtype), "adam weight copy"));
  }
  MemoryFence::Open o(fence_.get());
  uint64_t bad = 0;
  for (size_t k = 0; k < count; ++k) bad += adam_step(h, ranges[k], best_isa());
  *nonfinite += bad;
  return Status::Ok();
}

}  // namespace zoe

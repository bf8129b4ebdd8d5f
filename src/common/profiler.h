// Step timing and the Chrome trace. One per process (one rank per process): the engine, comm and
// models mark spans with ZOE_SPAN(name, cat, bucket); the trainer reads per-step bucket totals for
// the report and writes the trace at the end.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace zoe {

// Report buckets (contracts.md "time_s"): waiting for NVMe reads is wait_io, waiting for NVMe
// write-backs kWaitWrite (reported inside wait_io too, and apart as nvme_write).
enum class Bucket : uint8_t { kForward = 0, kBackward, kOptimizer, kWaitIo, kWaitComm, kWaitWrite, kNone };
inline constexpr int kNumBuckets = 6;

struct TraceEvent {
  std::string name;
  const char* cat;   // compute, all_gather, reduce_scatter, nvme_read, nvme_write, h2d, d2h, adam
  double ts_us, dur_us;
  int tid;
};

class Profiler {
 public:
  static Profiler& get();
  void enable_trace(bool on) { trace_ = on; }
  bool tracing() const { return trace_; }
  double now_us() const;
  void record(const std::string& name, const char* cat, Bucket b, double start_us, double end_us);
  // Spans of the calling thread go to the trace only, not to the step's buckets: for threads
  // that run beside the step (the optimizer's pass overlapped with the next forward), whose time
  // the step sees only where it waits for them.
  static void exclude_thread_from_buckets();
  // The calling thread's row in the trace is called `name` (main, optimizer, comm, nvme io, ...).
  // A thread named before it records takes the row of an ended thread of the same name, so a
  // thread started per step (the optimizer's pass) keeps one row.
  static void name_thread(const std::string& name);
  // Row names by tid, for the trace's metadata.
  std::map<int, std::string> thread_names();
  // Bucket totals since the last call, in seconds; resets them.
  std::array<double, kNumBuckets> take_step_times();
  // A copy: threads may still record (background write-backs) while it is written out.
  std::vector<TraceEvent> events() {
    std::lock_guard<std::mutex> l(mu_);
    return events_;
  }
  void clear_events() {
    std::lock_guard<std::mutex> l(mu_);
    events_.clear();
  }
  // While set (null: never), run at the start and the end of every "compute" span: a calibration
  // on a GPU sets its device's synchronize, so a span times its kernels rather than their
  // launches. The caller keeps *f alive until it sets null again.
  void set_compute_fence(const std::function<void()>* f) { fence_.store(f, std::memory_order_release); }
  void fence(const char* cat) const {
    const std::function<void()>* f = fence_.load(std::memory_order_acquire);
    if (f && std::strcmp(cat, "compute") == 0) (*f)();
  }

 private:
  Profiler();
  std::chrono::steady_clock::time_point t0_;
  bool trace_ = false;
  std::mutex mu_;
  std::array<double, kNumBuckets> step_{};
  std::vector<TraceEvent> events_;
  std::map<int, std::string> names_;
  std::set<int> ended_;  // named rows whose thread has ended
  std::atomic<const std::function<void()>*> fence_{nullptr};
  struct RowOwner;       // a named thread's row goes to ended_ when the thread ends
};

class Span {
 public:
  Span(std::string name, const char* cat, Bucket b)
      : name_(std::move(name)), cat_(cat), b_(b), start_((Profiler::get().fence(cat), Profiler::get().now_us())) {}
  ~Span() {
    Profiler& p = Profiler::get();
    p.fence(cat_);
    p.record(name_, cat_, b_, start_, p.now_us());
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string name_;
  const char* cat_;
  Bucket b_;
  double start_;
};

// Nested spans of the same bucket would be counted twice: mark a bucket once per region.
#define ZOE_SPAN(name, cat, bucket) ::zoe::Span ZOE_CONCAT(_zoe_span_, __LINE__)(name, cat, bucket)

}  // namespace zoe

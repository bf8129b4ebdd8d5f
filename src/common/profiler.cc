#include "common/profiler.h"

#include <functional>
#include <thread>

namespace zoe {

Profiler& Profiler::get() {
  static Profiler p;
  return p;
}

Profiler::Profiler() : t0_(std::chrono::steady_clock::now()) {}

double Profiler::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

namespace {
thread_local bool t_excluded = false;
}

void Profiler::exclude_thread_from_buckets() { t_excluded = true; }

void Profiler::record(const std::string& name, const char* cat, Bucket b, double start_us, double end_us) {
  std::lock_guard<std::mutex> l(mu_);
  if (b != Bucket::kNone && !t_excluded) step_[static_cast<int>(b)] += (end_us - start_us) * 1e-6;
  if (trace_) {
    int tid = static_cast<int>(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000);
    events_.push_back({name, cat, start_us, end_us - start_us, tid});
  }
}

std::array<double, kNumBuckets> Profiler::take_step_times() {
  std::lock_guard<std::mutex> l(mu_);
  auto s = step_;
  step_ = {};
  return s;
}

}  // namespace zoe

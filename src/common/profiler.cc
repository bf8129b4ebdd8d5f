#include "common/profiler.h"

#include <pthread.h>
#include <unistd.h>
#include <atomic>

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
thread_local int t_tid = -1;
std::atomic<int> g_next_tid{1};

// Rows are numbered in the order threads first record: small, stable and without collisions.
int this_tid() {
  if (t_tid < 0) t_tid = g_next_tid++;
  return t_tid;
}
}  // namespace

void Profiler::exclude_thread_from_buckets() { t_excluded = true; }

struct Profiler::RowOwner {
  int tid = -1;
  ~RowOwner() {
    if (tid < 0) return;
    Profiler& p = get();
    std::lock_guard<std::mutex> l(p.mu_);
    p.ended_.insert(tid);
  }
};

void Profiler::name_thread(const std::string& name) {
  static thread_local RowOwner t_row;
  Profiler& p = get();
  std::lock_guard<std::mutex> l(p.mu_);
  for (auto it = p.ended_.begin(); t_tid < 0 && it != p.ended_.end(); ++it)
    if (p.names_[*it] == name) {
      t_tid = *it;
      p.ended_.erase(it);
      break;
    }
  p.names_[this_tid()] = name;
  t_row.tid = t_tid;
  // The OS knows a worker's name too (top -H, perf, gdb; 15 bytes); the process keeps its own.
  if (gettid() != getpid()) pthread_setname_np(pthread_self(), ("zoe " + name).substr(0, 15).c_str());
}

std::map<int, std::string> Profiler::thread_names() {
  std::lock_guard<std::mutex> l(mu_);
  return names_;
}

void Profiler::record(const std::string& name, const char* cat, Bucket b, double start_us, double end_us) {
  std::lock_guard<std::mutex> l(mu_);
  if (b != Bucket::kNone && !t_excluded) step_[static_cast<int>(b)] += (end_us - start_us) * 1e-6;
  if (trace_) {
    events_.push_back({name, cat, start_us, end_us - start_us, this_tid()});
  }
}

std::array<double, kNumBuckets> Profiler::take_step_times() {
  std::lock_guard<std::mutex> l(mu_);
  auto s = step_;
  step_ = {};
  return s;
}

}  // namespace zoe

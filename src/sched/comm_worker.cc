#include "sched/comm_worker.h"

#include "common/profiler.h"
#include "common/status_of_call.h"

namespace zoe {

CommWorker::CommWorker(std::unique_ptr<Comm> comm) : comm_(std::move(comm)) {
  thread_ = std::thread([this] { run(); });
}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CommWorker::submit(Job job) {
  uint64_t t;
  {
    std::lock_guard<std::mutex> l(mu_);
    t = ++submitted_;
    queue_.emplace_back(t, std::move(job));
  }
  cv_.notify_all();
  return t;
}

Status CommWorker::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return done_.count(ticket) > 0; });
  Status st = std::move(done_[ticket]);
  done_.erase(ticket);
  return st;
}

CommBytes CommWorker::take_bytes() {
  std::lock_guard<std::mutex> l(mu_);
  CommBytes b = bytes_;
  bytes_ = {};
  return b;
}

// Drains the queue before stopping, so every submitted collective runs on every rank.
void CommWorker::run() {
  // The step sees this thread's time only where it waits for a job (kWaitComm).
  Profiler::exclude_thread_from_buckets();
  Profiler::name_thread("comm");
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [ticket, job] = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    Status st = status_of_call("communication thread", [&, &run = job] { return run(*comm_); });
    CommBytes b = comm_->bytes_sent();
    comm_->reset_counters();
    l.lock();
    bytes_ += b;
    done_[ticket] = std::move(st);
    cv_.notify_all();
  }
}

}  // namespace zoe

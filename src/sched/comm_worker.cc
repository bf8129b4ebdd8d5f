#include "sched/comm_worker.h"

#include "common/profiler.h"
#include "common/status_of_call.h"

namespace zoe {

CommWorker::CommWorker(std::unique_ptr<Comm> comm, Device& dev)
    : comm_(std::move(comm)),
      dev_(dev),
      stream_(comm_->tensor_stream()),
      by_events_(stream_ != Stream::kCompute) {
  thread_ = std::thread([this] { run(); });
}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Buffers the jobs used may be freed and reused by compute next.
  if (by_events_) (void)dev_.wait_on(Stream::kCompute, last_);
}

uint64_t CommWorker::submit(Job job) {
  const Event ready = by_events_ ? dev_.record(Stream::kCompute) : Event{};
  uint64_t t;
  {
    std::lock_guard<std::mutex> l(mu_);
    t = ++submitted_;
    queue_.push_back({t, std::move(job), ready});
  }
  cv_.notify_all();
  return t;
}

Status CommWorker::wait(uint64_t ticket) {
  Done d;
  {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_.count(ticket) > 0; });
    d = std::move(done_[ticket]);
    done_.erase(ticket);
  }
  Status ordered = by_events_ ? dev_.wait_on(Stream::kCompute, d.finished) : Status::Ok();
  return d.status.ok() ? ordered : d.status;
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
    Queued q = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    // The job runs whatever happened before it: the other ranks are in its collectives.
    const Status ordered = by_events_ ? dev_.wait_on(stream_, q.ready) : Status::Ok();
    Done d;
    if (broken_.ok()) {
      d.status = status_of_call("communication thread", [&] { return q.job(*comm_); });
      if (d.status.code() == Code::kComm) broken_ = d.status;
    } else {
      d.status = Status::CommError("not run: an earlier collective on the communication thread failed: " +
                                   broken_.message());
    }
    if (!ordered.ok()) d.status = ordered;
    if (by_events_) d.finished = dev_.record(stream_);
    CommBytes b = comm_->bytes_sent();
    comm_->reset_counters();
    l.lock();
    bytes_ += b;
    if (by_events_) last_ = d.finished;
    done_[q.ticket] = std::move(d);
    cv_.notify_all();
  }
}

}  // namespace zoe

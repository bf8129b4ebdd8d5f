// CommWorker: the thread that runs the engine's asynchronous collectives, one at a time and in
// submission order. Mechanism only: the engine decides what to submit and when to wait for it.
//
// It owns a communicator of its own (Comm::duplicate, an MPI_Comm_dup), so its collectives never
// interleave with the caller's on one communicator. Every rank submits the same collectives in the
// same order (the engine submits only after an agreement), so they match across ranks.
//
// Ordered by events where the communicator is (Comm::tensor_stream, NCCL's duplicate): a job's
// collectives start after the compute work enqueued before its submit(), and the compute work
// enqueued after its wait() sees their results; compute enqueued in between runs beside them.
// Such a communicator must be the only one issuing tensor collectives: `issues_all()`.
//
// A job whose collective failed (Code::kComm) leaves the communicator out of step with the other
// ranks: the jobs after it are not run (their tickets return that error), so this rank issues no
// collective the others never match, and its caller learns of the failure at its next wait().
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/comm.h"
#include "zoe/device.h"
#include "zoe/status.h"

namespace zoe {

class CommWorker {
 public:
  using Job = std::function<Status(Comm&)>;

  // `dev`: the device whose streams order the jobs' tensor traffic (comm's paired device).
  CommWorker(std::unique_ptr<Comm> comm, Device& dev);
  ~CommWorker();  // runs what was submitted, then stops; later compute waits for it
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Queues `job`; returns its ticket (1, 2, ...).
  uint64_t submit(Job job);
  // Waits until job `ticket` has run and returns its Status (each ticket is waited for once);
  // compute enqueued after it is ordered after the job's collectives.
  Status wait(uint64_t ticket);
  // Whether every tensor collective must go through this worker while it lives (see above).
  bool issues_all() const { return by_events_; }
  // What the jobs run so far put on the wire (the worker's counters, reset here).
  CommBytes take_bytes();
  Comm& comm() { return *comm_; }

 private:
  void run();

  struct Queued {
    uint64_t ticket;
    Job job;
    Event ready;  // the compute stream at submit()
  };
  struct Done {
    Status status;
    Event finished;  // the tensor stream after the job
  };

  std::unique_ptr<Comm> comm_;
  Device& dev_;
  const Stream stream_;  // comm_->tensor_stream()
  const bool by_events_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  std::map<uint64_t, Done> done_;  // results not yet waited for
  Event last_;                     // the tensor stream after the last job run
  Status broken_;                  // the first collective that failed (worker thread only)
  uint64_t submitted_ = 0;
  CommBytes bytes_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zoe

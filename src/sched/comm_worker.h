// CommWorker: the thread that runs the engine's asynchronous collectives, one at a time and in
// submission order. Mechanism only: the engine decides what to submit and when to wait for it.
//
// It owns a communicator of its own (Comm::duplicate, an MPI_Comm_dup), so its collectives never
// interleave with the caller's on one communicator. Every rank submits the same collectives in the
// same order (the engine submits only after an agreement), so they match across ranks.
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
#include "zoe/status.h"

namespace zoe {

class CommWorker {
 public:
  using Job = std::function<Status(Comm&)>;

  explicit CommWorker(std::unique_ptr<Comm> comm);
  ~CommWorker();  // runs what was submitted, then stops
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Queues `job`; returns its ticket (1, 2, ...).
  uint64_t submit(Job job);
  // Waits until job `ticket` has run and returns its Status (each ticket is waited for once).
  Status wait(uint64_t ticket);
  // What the jobs run so far put on the wire (the worker's counters, reset here).
  CommBytes take_bytes();
  Comm& comm() { return *comm_; }

 private:
  void run();

  std::unique_ptr<Comm> comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, Job>> queue_;
  std::map<uint64_t, Status> done_;  // results not yet waited for
  uint64_t submitted_ = 0;
  CommBytes bytes_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zoe

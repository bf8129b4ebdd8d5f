// IoWorker: the store's I/O thread. It cuts transfers into block requests (one per aio.block_size
// block of the region, aligned for O_DIRECT) and keeps up to aio.queue_depth of them in flight:
// each turn of its loop queues what fits and makes one system call that submits the batch and
// waits for a completion. -EAGAIN/-EINTR are resubmitted, short transfers resubmitted for the
// rest, any other error fails the transfer with a Status naming file, offset, op and errno. A
// failure of the queue itself (the system call) fails every transfer, but a request the kernel
// took keeps its memory (the caller's or a bounce buffer) until its completion is reaped: only
// then does its transfer complete (see fail_all, reap_failed).
//
// How each block moves, straight from the caller's memory (registered buffers when it is in the
// pinned pool) or through a bounce buffer with read-modify-write, is BlockPlan's (block_plan.h).
// Requests touching the same bytes run in submission order; otherwise foreground reads go first
// and writes fill the slots they leave (transfer_order.h), and background transfers fill in when
// no foreground block is waiting, in batches the block layer can merge. Each request is submitted
// alone, as fio does (batched, the kernel merged them into fewer, larger ones: ~8 in flight, not 32). With checksums every write records the xxh3-64 of
// its whole block and every read of a written block verifies it.
//
// A read whose every byte a write still pending here holds is served from those writes' memory
// as it arrives (PendingWrites), without waiting for them or the device.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "nvme/block_plan.h"
#include "nvme/io_queue.h"
#include "nvme/pending_writes.h"
#include "nvme/pinned_pool.h"
#include "nvme/transfer.h"
#include "nvme/transfer_order.h"

namespace zoe {

struct IoWorkerParams {
  IoQueue* queue = nullptr;
  uint32_t block_bytes = 1 << 20;
  const PinnedPool* registered = nullptr;  // the pool whose pieces are registered with the queue
  std::vector<uint8_t*> bounce;            // block_bytes each, page-aligned
};

class IoWorker {
 public:
  explicit IoWorker(IoWorkerParams p);  // starts the thread
  ~IoWorker();                          // stop()
  IoWorker(const IoWorker&) = delete;
  IoWorker& operator=(const IoWorker&) = delete;

  void submit(std::shared_ptr<Transfer> t);
  Status wait(const Transfer& t);
  bool done(const Transfer& t);  // without waiting
  // Runs fn on the I/O thread and returns its Status: the queue belongs to that thread (io_uring
  // single issuer), so registering files or buffers goes through here.
  Status call(std::function<Status(IoQueue&)> fn);
  // Finishes everything submitted, then ends the thread. Idempotent.
  void stop();
  // Returns once every transfer submitted so far has completed (or failed).
  void wait_idle();
  // Bytes the device has read and written so far, padding and read-modify-write included.
  uint64_t device_read_bytes() const { return read_bytes_.load(std::memory_order_relaxed); }
  uint64_t device_written_bytes() const { return written_bytes_.load(std::memory_order_relaxed); }
  // Bytes this thread has hashed (block sums it made or checked, not the callers').
  uint64_t hashed_bytes() const { return hashed_bytes_.load(std::memory_order_relaxed); }
  // Bytes reads took from pending writes' memory instead of the device.
  uint64_t forwarded_bytes() const { return forwarded_bytes_.load(std::memory_order_relaxed); }
  // Bytes reads of never-written blocks gave as zeros without a request.
  uint64_t zero_filled_bytes() const { return zero_filled_bytes_.load(std::memory_order_relaxed); }
  // Bounce buffers (indices into IoWorkerParams::bounce) whose requests were abandoned after the
  // queue failed: the kernel may still use them, so they must never be reused. Read after stop().
  const std::vector<int>& abandoned_bounce() const { return abandoned_bounce_; }

 private:
  struct Task {
    std::shared_ptr<Transfer> t;  // null: the slot is free
    BlockPlan plan;               // its block, request span and how it moves
    IoOp phase = IoOp::kRead;     // the request in flight
    uint32_t done = 0;            // of plan.io_bytes(), transferred so far
    uint8_t* io_buf = nullptr;    // the caller's memory (direct) or a bounce buffer
    int buf_index = -1;
    int bounce = -1;              // bounce slot, -1 when direct
    uint8_t* user = nullptr;      // the caller's memory at plan.user_begin
    uint64_t sum = 0;             // writes: recorded once the write completes
  };

  void run();
  void admit(std::deque<std::shared_ptr<Transfer>>& arrived);
  void fill();
  void retire(TransferList& list);
  bool retire_at(TransferList& list, size_t i);  // list[i] left, if it has nothing more to hand out
  size_t background_room() const;  // background blocks fill() may start now
  enum class Start { kStarted, kStalled };
  Start start_block(const std::shared_ptr<Transfer>& tp);
  Start start_foreground();
  bool fail_if_nothing_in_flight(Transfer& t);  // true: t failed (nothing will ever free what it needs)
  uint64_t hash(const uint8_t* data, size_t bytes);  // BlockTable::hash, counted in hashed_bytes_
  void set_write_sum(int slot);
  void hash_pending();
  void handle_batch(std::vector<IoCompletion>& cq);
  void enqueue(int slot);
  void handle(const IoCompletion& c);
  bool verify(int slot);
  void finish(int slot);
  void fail(int slot, Status s);
  void complete(Transfer& t);
  void fail_all(const Status& s);
  void reap_failed(const Status& s);

  IoQueue* queue_;
  const uint32_t block_;
  const PinnedPool* registered_;
  std::vector<uint8_t*> bounce_;
  std::vector<int> free_bounce_;
  std::vector<Task> tasks_;       // one slot per request the queue may hold
  std::vector<int> free_slots_;
  int in_flight_ = 0;
  int background_in_flight_ = 0;  // of in_flight_: background transfers' requests
  int reap_failures_ = 0;         // failed reaps in a row since the queue failed
  std::vector<int> abandoned_bounce_;
  std::vector<int> to_hash_;      // write slots whose sums hash_pending() makes, once they are submitted
  std::deque<std::shared_ptr<Transfer>> active_;  // the I/O thread's: blocks left to hand out
  std::deque<std::shared_ptr<Transfer>> background_;  // the same, started when active_ is empty
  PendingWrites pending_writes_;  // writes not yet complete, and the reads they serve

  std::mutex mu_;
  std::condition_variable work_, done_;
  std::deque<std::shared_ptr<Transfer>> incoming_;
  struct Call {
    std::function<Status(IoQueue&)> fn;
    Status result;
    bool done = false;
  };
  std::deque<Call*> calls_;
  bool stopping_ = false;
  int64_t outstanding_ = 0;       // transfers submitted and not yet complete
  bool in_kernel_ = false;        // the thread may be blocked in submit_and_wait
  Status broken_;                 // the queue itself failed: every later transfer fails too
  std::atomic<uint64_t> read_bytes_{0}, written_bytes_{0}, hashed_bytes_{0}, forwarded_bytes_{0}, zero_filled_bytes_{0};
  std::thread thread_;
};

}  // namespace zoe

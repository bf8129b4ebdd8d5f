// IoQueue: the read/write submission of the NVMe tier, byte ranges of registered files to
// or from memory. The real one is io_uring (UringQueue); tests wrap it to inject faults.
#pragma once
#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <vector>

#include "zoe/status.h"

namespace zoe {

enum class IoOp : uint8_t { kRead, kWrite };
inline const char* io_op_name(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

struct IoRequest {
  IoOp op = IoOp::kRead;
  int file = -1;          // an index returned by IoQueue::add_file
  uint64_t offset = 0;    // file offset; O_DIRECT wants it aligned
  void* buf = nullptr;
  uint32_t bytes = 0;
  int buf_index = -1;     // the registered buffer holding [buf, buf + bytes), or -1 for plain memory
  uint64_t tag = 0;       // handed back in the completion
  // false: the request enters the kernel at once, on its own, so the disk sees it as it is (a
  // block of aio.block_size) beside the others in flight, as fio's requests; true: it waits for
  // submit_and_wait with the other batched ones, and the kernel merges neighbours into fewer,
  // larger requests (fewer interrupts, fewer in flight).
  bool batched = false;
};

struct IoCompletion {
  uint64_t tag = 0;
  int32_t result = 0;     // bytes transferred (possibly fewer than asked), or -errno
};

// Not thread-safe: one thread uses a queue (see attach_thread); wake() may come from any thread.
class IoQueue {
 public:
  virtual ~IoQueue() = default;

  // Requests that may be in flight at once (the ring's size, aio.queue_depth).
  virtual unsigned depth() const = 0;

  // Registers an open file with the queue; requests name it by the returned index, so the
  // kernel skips the per-request file lookup.
  virtual Result<int> add_file(int fd) = 0;
  virtual Status remove_file(int index) = 0;

  // Registers memory that stays put for the queue's lifetime (the pinned pool); a request whose
  // buffer lies inside registered piece i passes buf_index = i and the kernel skips pinning its
  // pages on every request. Called at most once.
  virtual Status register_buffers(std::span<const iovec> pieces) = 0;

  // Places a request in the submission queue, and submits it unless it is batched. The caller
  // keeps at most depth() requests in flight (enqueued and not yet completed).
  virtual Status enqueue(const IoRequest& r) = 0;

  // Submits everything enqueued and waits until at least `wait_for` completions are ready or
  // wake() is called, in one system call; appends every ready completion to *out.
  virtual Status submit_and_wait(unsigned wait_for, std::vector<IoCompletion>* out) = 0;

  // Thread-safe: makes a submit_and_wait that is blocked (or the next one) return early, so a
  // request queued by another thread does not wait for an unrelated completion.
  virtual void wake() = 0;

  // Called once, first, on the one thread that makes every other call from then on (except
  // wake): io_uring's single-issuer mode ties the ring to that thread.
  virtual Status attach_thread() = 0;
};

}  // namespace zoe

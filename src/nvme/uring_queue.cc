#include "nvme/uring_queue.h"

#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "common/posix_io.h"

namespace zoe {

namespace {
Status uring_error(const std::string& what, int neg_err) {
  return Status::Io("io_uring: " + what + " failed: " + errno_string(-neg_err));
}
}  // namespace

Result<std::unique_ptr<UringQueue>> UringQueue::create(unsigned depth) {
  if (depth == 0) return Status::Invalid("io_uring: queue depth must be at least 1");
  std::unique_ptr<UringQueue> q(new UringQueue());
  q->depth_ = depth;
  // One entry more than the depth: the armed wake-up read.
  // Single issuer + deferred task work, created disabled so that the thread that will issue
  // (attach_thread) becomes the ring's owner; plain where the kernel predates them (< 6.1).
  io_uring_params params{};
  params.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                 IORING_SETUP_R_DISABLED;
  int r = io_uring_queue_init_params(depth + 1, &q->ring_, &params);
  if (r == -EINVAL) {
    params = io_uring_params{};
    r = io_uring_queue_init_params(depth + 1, &q->ring_, &params);
  }
  if (r < 0) {
    Status s = uring_error("io_uring_queue_init(" + std::to_string(depth + 1) + " entries)", r);
    if (r == -ENOMEM || r == -EPERM)
      s = Status::Io(s.message() + " (io_uring may be disabled: kernel.io_uring_disabled, or RLIMIT_MEMLOCK too low)");
    return s;
  }
  q->single_issuer_ = params.flags & IORING_SETUP_SINGLE_ISSUER;
  q->disabled_ = params.flags & IORING_SETUP_R_DISABLED;
  q->ring_ok_ = true;
  q->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (q->wake_fd_ < 0) return Status::Io("io_uring: eventfd failed: " + errno_string(errno));
  r = io_uring_register_files_sparse(&q->ring_, kMaxFiles);
  if (r < 0) return uring_error("registering a file table", r);
  q->files_.assign(kMaxFiles, -1);
  return q;
}

UringQueue::~UringQueue() {
  if (ring_ok_) io_uring_queue_exit(&ring_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Result<int> UringQueue::add_file(int fd) {
  for (unsigned slot = 0; slot < files_.size(); ++slot) {
    if (files_[slot] >= 0) continue;
    int r = io_uring_register_files_update(&ring_, slot, &fd, 1);
    if (r < 0) return uring_error("registering a file", r);
    files_[slot] = fd;
    return static_cast<int>(slot);
  }
  return Status::Invalid("io_uring: more than " + std::to_string(kMaxFiles) + " files registered with one queue");
}

Status UringQueue::remove_file(int index) {
  if (index < 0 || index >= static_cast<int>(files_.size()) || files_[index] < 0) return Status::Ok();
  int none = -1;
  int r = io_uring_register_files_update(&ring_, static_cast<unsigned>(index), &none, 1);
  if (r < 0) return uring_error("unregistering a file", r);
  files_[index] = -1;
  return Status::Ok();
}

Status UringQueue::register_buffers(std::span<const iovec> pieces) {
  if (buffers_registered_) return Status::Runtime("io_uring: buffers registered twice");
  int r = io_uring_register_buffers(&ring_, pieces.data(), static_cast<unsigned>(pieces.size()));
  if (r < 0) {
    Status s = uring_error("registering " + std::to_string(pieces.size()) + " pinned buffers", r);
    if (r == -ENOMEM)
      s = Status::OutOfMemory(s.message() + " (the pinned pool exceeds RLIMIT_MEMLOCK: raise `ulimit -l` or pin less)");
    return s;
  }
  buffers_registered_ = true;
  return Status::Ok();
}

Status UringQueue::enqueue(const IoRequest& req) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) return Status::Runtime("io_uring: submission queue full (more than the queue depth in flight)");
  if (req.op == IoOp::kRead) {
    if (req.buf_index >= 0)
      io_uring_prep_read_fixed(sqe, req.file, req.buf, req.bytes, req.offset, req.buf_index);
    else
      io_uring_prep_read(sqe, req.file, req.buf, req.bytes, req.offset);
  } else {
    if (req.buf_index >= 0)
      io_uring_prep_write_fixed(sqe, req.file, req.buf, req.bytes, req.offset, req.buf_index);
    else
      io_uring_prep_write(sqe, req.file, req.buf, req.bytes, req.offset);
  }
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, req.tag);
  if (req.batched) return Status::Ok();
  // On its own, as fio's requests: the kernel plugs a batch of more than two and merges
  // neighbours there; on a virtio disk 32 x 1 MiB went out as ~9 x 3 MiB, read at 0.82-0.93 of
  // fio's rate, and the out-of-core step's disk saw ~8 requests in flight instead of ~27 (issue
  // 49). A failed submit leaves the entry queued: submit_and_wait submits it or reports why not.
  (void)io_uring_submit(&ring_);
  return Status::Ok();
}

Status UringQueue::submit_and_wait(unsigned wait_for, std::vector<IoCompletion>* out) {
  if (!wake_armed_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) return Status::Runtime("io_uring: no room for the wake-up read");
    io_uring_prep_read(sqe, wake_fd_, &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
    wake_armed_ = true;
  }
  int r = io_uring_submit_and_wait(&ring_, wait_for);
  // Interrupted or short of kernel resources: what was submitted stays submitted; the caller
  // comes back with whatever completed.
  if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) return uring_error("io_uring_enter", r);
  io_uring_cqe* cqes[64];
  for (;;) {
    unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 64);
    if (n == 0) break;
    for (unsigned i = 0; i < n; ++i) {
      const uint64_t tag = io_uring_cqe_get_data64(cqes[i]);
      if (tag == kWakeTag) {
        wake_armed_ = false;  // re-armed by the next call
        continue;
      }
      out->push_back({tag, cqes[i]->res});
    }
    io_uring_cq_advance(&ring_, n);
  }
  return Status::Ok();
}

Status UringQueue::attach_thread() {
  if (!disabled_) return Status::Ok();
  // liburing 2.3 declares io_uring_enable_rings but does not export it: the system call itself.
  if (::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) < 0)
    return uring_error("enabling the ring", -errno);
  disabled_ = false;
  return Status::Ok();
}

void UringQueue::wake() {
  const uint64_t one = 1;
  // Fails only when the counter is saturated, and then a wake-up is already pending.
  (void)!::write(wake_fd_, &one, sizeof one);
}

}  // namespace zoe

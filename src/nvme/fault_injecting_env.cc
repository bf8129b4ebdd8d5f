#include "nvme/fault_injecting_env.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <unordered_map>

#include "nvme/io_error.h"

namespace zoe {

namespace {

// Forwards to the wrapped queue; requests the env condemns complete with their errno at the
// next submit_and_wait, as the kernel would report them.
class FaultInjectingQueue : public IoQueue {
 public:
  FaultInjectingQueue(std::unique_ptr<IoQueue> base, FaultInjectingEnv* env) : base_(std::move(base)), env_(env) {}

  unsigned depth() const override { return base_->depth(); }
  Result<int> add_file(int fd) override { return base_->add_file(fd); }
  Status remove_file(int index) override { return base_->remove_file(index); }
  Status register_buffers(std::span<const iovec> pieces) override { return base_->register_buffers(pieces); }
  void wake() override {
    woken_.store(true);
    base_->wake();
  }
  Status attach_thread() override { return base_->attach_thread(); }

  Status enqueue(const IoRequest& r) override {
    ++enqueued_[static_cast<int>(r.op)];
    const FaultInjectingEnv::Verdict v = env_->next_request(r.op);
    if (v.err > 0) {
      injected_.push_back({r.tag, -v.err});
      return Status::Ok();
    }
    IoRequest fwd = r;
    if (v.shorten && r.bytes >= 8192) fwd.bytes = (r.bytes / 2) & ~uint32_t{4095};
    ops_[r.tag] = r.op;
    if (env_->held(r.op)) {
      held_.push_back(fwd);
      return Status::Ok();
    }
    return base_->enqueue(fwd);
  }

  Status submit_and_wait(unsigned wait_for, std::vector<IoCompletion>* out) override {
    if (Status s = injected_failure(); !s.ok()) return s;
    for (IoOp op : {IoOp::kRead, IoOp::kWrite}) {
      env_->note_submission(op, enqueued_[static_cast<int>(op)]);
      enqueued_[static_cast<int>(op)] = 0;
    }
    ZOE_RETURN_IF_ERROR(release_held());
    if (!injected_.empty()) {
      Status s = base_wait(0, out);
      out->insert(out->end(), injected_.begin(), injected_.end());
      injected_.clear();
      return s;
    }
    if (held_.empty()) return base_wait(wait_for, out);
    // Held requests complete only once released: poll the file's queue until something completes,
    // the hold ends or wake() is called, as the kernel's wait would return.
    for (;;) {
      if (Status s = injected_failure(); !s.ok()) return s;
      Status s = base_wait(0, out);
      if (!s.ok() || !out->empty() || wait_for == 0 || woken_.exchange(false)) return s;
      if (!env_->held(IoOp::kRead) && !env_->held(IoOp::kWrite)) {
        ZOE_RETURN_IF_ERROR(release_held());
        return base_wait(wait_for, out);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  Status injected_failure() {
    const int err = env_->take_submit_failure();
    if (err == 0) return Status::Ok();
    return Status::Io("io_uring: io_uring_enter failed: " + errno_text(err) + " (injected)");
  }

  // The file's queue's completions, their bytes counted by kind (FaultInjectingEnv::completed_bytes).
  Status base_wait(unsigned wait_for, std::vector<IoCompletion>* out) {
    const size_t before = out->size();
    Status s = base_->submit_and_wait(wait_for, out);
    for (size_t i = before; i < out->size(); ++i) {
      auto it = ops_.find((*out)[i].tag);
      if (it != ops_.end() && (*out)[i].result > 0) env_->count_completed(it->second, (*out)[i].result);
    }
    return s;
  }

  // Held requests whose kind is no longer held go to the file's queue.
  Status release_held() {
    std::vector<IoRequest> still;
    for (const IoRequest& r : held_)
      if (env_->held(r.op))
        still.push_back(r);
      else
        ZOE_RETURN_IF_ERROR(base_->enqueue(r));
    held_.swap(still);
    return Status::Ok();
  }

  std::unique_ptr<IoQueue> base_;
  FaultInjectingEnv* env_;
  std::vector<IoCompletion> injected_;
  std::vector<IoRequest> held_;
  std::unordered_map<uint64_t, IoOp> ops_;  // tag -> kind of the requests forwarded to the file
  std::atomic<bool> woken_{false};
  int enqueued_[2] = {0, 0};  // since the last submit_and_wait
};

}  // namespace

void FaultInjectingEnv::fail_requests(IoOp op, int k, int err, int times) {
  std::lock_guard l(mu_);
  rules_.push_back({op, k, k + times - 1, err});
}

void FaultInjectingEnv::shorten_request(IoOp op, int k) {
  std::lock_guard l(mu_);
  rules_.push_back({op, k, k, 0});
}

void FaultInjectingEnv::set_free_bytes(std::optional<uint64_t> bytes) {
  std::lock_guard l(mu_);
  free_bytes_ = bytes;
}

void FaultInjectingEnv::note_submission(IoOp op, int requests) {
  std::atomic<int>& most = largest_[static_cast<int>(op)];
  int seen = most.load();
  while (requests > seen && !most.compare_exchange_weak(seen, requests)) {
  }
}

FaultInjectingEnv::Verdict FaultInjectingEnv::next_request(IoOp op) {
  const int n = ++count_[static_cast<int>(op)];
  std::lock_guard l(mu_);
  Verdict v;
  for (const Rule& r : rules_) {
    if (r.op != op || n < r.first || n > r.last) continue;
    if (r.err > 0)
      v.err = r.err;
    else
      v.shorten = true;
  }
  return v;
}

int FaultInjectingEnv::take_submit_failure() {
  int left = failing_submits_.load();
  while (left > 0 && !failing_submits_.compare_exchange_weak(left, left - 1)) {
  }
  return left > 0 ? submit_err_.load() : 0;
}

Status FaultInjectingEnv::allocate(int fd, const std::string& path, uint64_t bytes) {
  if (!sparse_allocate_) return base_->allocate(fd, path, bytes);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    return Status::Io(path + ": ftruncate to " + std::to_string(bytes) + " bytes failed: " + errno_text(errno));
  return Status::Ok();
}

Result<uint64_t> FaultInjectingEnv::free_bytes(const Dir& d) {
  {
    std::lock_guard l(mu_);
    if (free_bytes_) return *free_bytes_;
  }
  return base_->free_bytes(d);
}

Result<std::unique_ptr<IoQueue>> FaultInjectingEnv::new_queue(unsigned depth) {
  ZOE_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> q, base_->new_queue(depth));
  return std::unique_ptr<IoQueue>(new FaultInjectingQueue(std::move(q), this));
}

}  // namespace zoe

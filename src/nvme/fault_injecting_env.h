// FaultInjectingEnv: an NvmeEnv that forwards to another (normally the real one) and makes chosen
// calls fail, so tests can drive every error path of the store through real files and a real
// io_uring: the k-th read or write request fails with an errno (EIO, ENOSPC, EAGAIN, ...) or
// transfers only part of its bytes, or waits until released; free space can be misreported and
// preallocation skipped.
#pragma once
#include <atomic>
#include <mutex>
#include <optional>
#include <vector>

#include "nvme/nvme_env.h"

namespace zoe {

class FaultInjectingEnv : public NvmeEnv {
 public:
  explicit FaultInjectingEnv(NvmeEnv* base) : base_(base) {}

  // Requests k .. k+times-1 of kind `op` (1-based; every request counts, resubmissions included)
  // complete with -err without reaching the file.
  void fail_requests(IoOp op, int k, int err, int times = 1);
  // Request k of kind `op` reaches the file with half its bytes (rounded down to 4 KiB), as a
  // short transfer by the kernel would; the submitter must resubmit the rest.
  void shorten_request(IoOp op, int k);
  // free_bytes() reports this instead of asking the file system.
  void set_free_bytes(std::optional<uint64_t> bytes);
  // allocate() only sets the file size (ftruncate): the space is not reserved, so writes can
  // meet a full file system for real.
  void set_sparse_allocate(bool sparse) { sparse_allocate_ = sparse; }
  // While on, requests of kind `op` stay in the queue and never reach the file: the transfers
  // they belong to stay pending until hold(op, false), deterministically.
  void hold(IoOp op, bool on) { held_[static_cast<int>(op)].store(on); }
  bool held(IoOp op) const { return held_[static_cast<int>(op)].load(); }
  // The next `times` calls of the queue's submit_and_wait fail with -err as a whole (as a failed
  // io_uring_enter would), handing nothing further to the kernel: requests already there (held
  // ones too) stay there, to complete at a later call that succeeds.
  void fail_submits(int err, int times = 1) {
    submit_err_.store(err);
    failing_submits_.store(times);
  }
  // Takes one failure of fail_submits: the errno, or 0 when none is left.
  int take_submit_failure();
  // Requests of kind `op` seen so far.
  int requests(IoOp op) const { return count_[static_cast<int>(op)].load(); }
  // Bytes the file's queue reported transferred for requests of kind `op`: what the kernel moved,
  // counted apart from the store's own counters.
  uint64_t completed_bytes(IoOp op) const { return completed_[static_cast<int>(op)].load(); }
  void count_completed(IoOp op, uint64_t bytes) { completed_[static_cast<int>(op)] += bytes; }  // by the queue wrapper
  // The most requests of kind `op` that one submit_and_wait handed to the kernel together.
  int largest_submission(IoOp op) const { return largest_[static_cast<int>(op)].load(); }
  void note_submission(IoOp op, int requests);  // by the queue wrapper

  struct Verdict {
    int err = 0;        // > 0: complete with -err instead of submitting
    bool shorten = false;
  };
  // Counts one request of kind `op` and says what to do with it (used by the queue wrapper).
  Verdict next_request(IoOp op);

  Status create_dir(const std::string& path) override { return base_->create_dir(path); }
  Result<std::string> resolve(const std::string& path, bool* was_link) override {
    return base_->resolve(path, was_link);
  }
  Result<Dir> open_dir(const std::string& path) override { return base_->open_dir(path); }
  Result<bool> make_dir_at(const Dir& d, const std::string& name) override { return base_->make_dir_at(d, name); }
  Result<Dir> open_dir_at(const Dir& d, const std::string& name) override { return base_->open_dir_at(d, name); }
  Result<EntryInfo> stat_at(const Dir& d, const std::string& name) override { return base_->stat_at(d, name); }
  Status make_private(const Dir& d) override { return base_->make_private(d); }
  Result<bool> try_lock(const Dir& d) override { return base_->try_lock(d); }
  Status create_file_at(const Dir& d, const std::string& name) override { return base_->create_file_at(d, name); }
  Result<std::vector<std::string>> list_dir(const Dir& d) override { return base_->list_dir(d); }
  Result<DirectFile> create_direct_at(const Dir& d, const std::string& name) override {
    return base_->create_direct_at(d, name);
  }
  Status allocate(int fd, const std::string& path, uint64_t bytes) override;
  Result<uint64_t> free_bytes(const Dir& d) override;
  Status remove_file_at(const Dir& d, const std::string& name) override { return base_->remove_file_at(d, name); }
  Status remove_dir_at(const Dir& d, const std::string& name) override { return base_->remove_dir_at(d, name); }
  void close_fd(int fd) override { base_->close_fd(fd); }
  Result<std::unique_ptr<IoQueue>> new_queue(unsigned depth) override;

 private:
  struct Rule {
    IoOp op;
    int first, last;  // 1-based request numbers
    int err;          // 0: shorten
  };
  NvmeEnv* base_;
  std::mutex mu_;
  std::vector<Rule> rules_;
  std::atomic<int> count_[2] = {0, 0};
  std::atomic<uint64_t> completed_[2] = {0, 0};
  std::atomic<int> largest_[2] = {0, 0};
  std::atomic<bool> held_[2] = {false, false};
  std::atomic<int> failing_submits_{0}, submit_err_{0};
  std::optional<uint64_t> free_bytes_;
  bool sparse_allocate_ = false;
};

}  // namespace zoe

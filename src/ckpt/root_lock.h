// One job per checkpoint root. The rank that writes checkpoints (rank 0) holds an flock on
// `<root>/.zoe-checkpoint.lock` for the job's life: a second job on the same root would delete the
// first's in-progress saves (step_*.tmp.*), prune its checkpoints and resume from its state. The
// file holds the holder's pid and host so that the refusal can name it; the lock, not the file's
// existence, is what counts (a killed job's lock is free again, its file stays).
#pragma once
#include <optional>
#include <string>

#include "comm/comm.h"
#include "zoe/status.h"

namespace zoe {

inline constexpr const char* kCheckpointLockName = ".zoe-checkpoint.lock";

class CheckpointRootLock {
 public:
  // Creates `root` if missing. InvalidInput naming the holder when another process (or another
  // lock in this one) holds it; `what` names where root came from ("config key '...'").
  static Result<CheckpointRootLock> Acquire(const std::string& root, const std::string& what);
  // Collective: rank 0 (the rank that writes checkpoints) acquires the lock, and every rank
  // fails alike when it cannot; the other ranks hold nothing.
  static Result<std::optional<CheckpointRootLock>> AcquireOnRankZero(const std::string& root, const std::string& what,
                                                                   Comm& comm);

  CheckpointRootLock(CheckpointRootLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  CheckpointRootLock& operator=(CheckpointRootLock&& o) noexcept;
  CheckpointRootLock(const CheckpointRootLock&) = delete;
  CheckpointRootLock& operator=(const CheckpointRootLock&) = delete;
  ~CheckpointRootLock();  // closing the descriptor releases the lock

 private:
  explicit CheckpointRootLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace zoe

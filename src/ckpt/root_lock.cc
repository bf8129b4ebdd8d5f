#include "ckpt/root_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "common/posix_io.h"

namespace zoe {

namespace {

Status in_use(const std::string& root, const std::string& what, int fd) {
  char holder[256] = {};
  ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
  std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
  while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
  if (who.empty()) who = "a job that has not written its pid yet";
  return Status::Invalid(
      fmt::format("{}: '{}' is in use by another job ({}); one job per checkpoint directory", what, root, who));
}

}  // namespace

Result<std::optional<CheckpointRootLock>> CheckpointRootLock::AcquireOnRankZero(const std::string& root,
                                                                               const std::string& what, Comm& comm) {
  std::optional<CheckpointRootLock> held;
  Status locked = Status::Ok();
  if (comm.rank() == 0) {
    auto lock = Acquire(root, what);
    locked = lock.status();
    if (lock.ok()) held.emplace(std::move(lock).value());
  }
  ZOE_RETURN_IF_ERROR(
      agree(comm, locked, Status::Invalid(fmt::format("{}: rank 0 could not lock the checkpoint directory", what))));
  return held;
}

Result<CheckpointRootLock> CheckpointRootLock::Acquire(const std::string& root, const std::string& what) {
  Status made = make_private_dirs(root);
  if (!made.ok()) return Status::Invalid(fmt::format("{}: checkpoint directory: {}", what, made.message()));
  std::string path = root + "/" + kCheckpointLockName;
  // O_NOFOLLOW: a link planted under the lock's name must not make us truncate its target;
  // O_NONBLOCK: a FIFO planted there must not hang the job before fstat refuses it.
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) return open_error(path, "checkpoint lock file", errno);
  CheckpointRootLock lock(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::Io(fmt::format("{}: fstat: {}", path, errno_string(errno)));
  if (!S_ISREG(st.st_mode))
    return Status::Invalid(fmt::format("{}: the checkpoint lock '{}' is {}, not a regular file; remove it", what, path,
                                       file_kind(st.st_mode)));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return in_use(root, what, fd);
    return Status::Io(fmt::format("{}: flock: {}", path, errno_string(errno)));
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown host");
  std::string who = fmt::format("pid {} on host {}\n", getpid(), host);
  if (ftruncate(fd, 0) != 0) return Status::Io(fmt::format("{}: ftruncate: {}", path, errno_string(errno)));
  ZOE_RETURN_IF_ERROR(write_all(fd, who.data(), who.size(), path));  // at offset 0: nothing read or written yet
  return lock;
}

CheckpointRootLock& CheckpointRootLock::operator=(CheckpointRootLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

CheckpointRootLock::~CheckpointRootLock() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace zoe

#include "ckpt/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "common/posix_io.h"

namespace zoe {

Result<AtomicFile> AtomicFile::Create(const std::string& path) {
  if (path.empty() || path.back() == '/') return Status::Invalid("'" + path + "': not a file path");
  AtomicFile f;
  f.path_ = path;
  f.tmp_ = path + ".tmp." + std::to_string(::getpid());
  f.fd_ = ::open(f.tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return open_error(f.tmp_, "create", errno);
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept { *this = std::move(o); }

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this == &o) return *this;
  abort();
  path_ = std::move(o.path_);
  tmp_ = std::move(o.tmp_);
  fd_ = std::exchange(o.fd_, -1);
  bytes_ = std::exchange(o.bytes_, 0);
  sum_ = std::move(o.sum_);
  o.sum_ = Checksum();
  error_ = std::move(o.error_);
  committed_ = std::exchange(o.committed_, false);
  return *this;
}

AtomicFile::~AtomicFile() { abort(); }

void AtomicFile::abort() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
  }
}

Status AtomicFile::append(const void* data, size_t n) {
  if (!error_.ok()) return error_;
  if (committed_ || fd_ < 0) return Status::Runtime(path_ + ": append to a closed AtomicFile");
  Status s = write_all(fd_, data, n, tmp_);
  if (!s.ok()) {
    error_ = s;
    abort();
    return s;
  }
  sum_.update(data, n);
  bytes_ += n;
  return Status::Ok();
}

Status AtomicFile::commit() {
  if (!error_.ok()) return error_;
  if (committed_ || fd_ < 0) return Status::Runtime(path_ + ": commit of a closed AtomicFile");
  auto fail = [&](Status s) {
    error_ = s;
    abort();
    return s;
  };
  Status s = fsync_fd(fd_, tmp_);
  if (!s.ok()) return fail(s);
  int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp_.c_str());
    error_ = Status::Io(tmp_ + ": close failed: " + errno_string(e));
    return error_;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp_.c_str());
    error_ = Status::Io(path_ + ": cannot rename " + tmp_ + " into place: " + errno_string(e));
    return error_;
  }
  committed_ = true;
  return fsync_dir(parent_dir(path_));
}

Status write_file_atomic(const std::string& path, const void* data, size_t n) {
  ZOE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
  ZOE_RETURN_IF_ERROR(f.append(data, n));
  return f.commit();
}

}  // namespace zoe

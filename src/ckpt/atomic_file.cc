#include "ckpt/atomic_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <utility>

#include "common/posix_io.h"

namespace zoe {

namespace {

// 64 unpredictable bits as 16 hex digits, so that no neighbour can plant a file at the name first.
std::string random_hex() {
  uint64_t v = 0;
  ssize_t got;
  while ((got = ::getrandom(&v, sizeof v, 0)) < 0 && errno == EINTR) {
  }
  if (got != static_cast<ssize_t>(sizeof v))  // no getrandom: the clock and the address still vary
    v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        reinterpret_cast<uintptr_t>(&v);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

Result<AtomicFile> AtomicFile::Create(const std::string& path) {
  if (path.empty() || path.back() == '/') return Status::Invalid("'" + path + "': not a file path");
  AtomicFile f;
  f.path_ = path;
  f.name_ = base_name(path);
  if (f.name_ == "." || f.name_ == "..") return Status::Invalid("'" + path + "': not a file path");
  const std::string dir = parent_dir(path);
  f.dir_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!f.dir_.valid()) return open_error(dir, "open the directory of " + path, errno);
  ZOE_RETURN_IF_ERROR(check_replaceable(f.dir_.get(), f.name_, path));
  f.tmp_name_ = f.name_ + ".tmp." + std::to_string(::getpid()) + "." + random_hex();
  f.tmp_ = (dir == "." && path.find('/') == std::string::npos) ? f.tmp_name_ : dir + "/" + f.tmp_name_;
  f.fd_ = ::openat(f.dir_.get(), f.tmp_name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (f.fd_ < 0) return open_error(f.tmp_, "create", errno);
  // 0600 whatever the umask: a checkpoint holds the whole model.
  if (::fchmod(f.fd_, 0600) != 0) {
    Status s = open_error(f.tmp_, "set mode 0600 on", errno);
    f.abort();
    return s;
  }
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept { *this = std::move(o); }

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this == &o) return *this;
  abort();
  path_ = std::move(o.path_);
  tmp_ = std::move(o.tmp_);
  name_ = std::move(o.name_);
  tmp_name_ = std::move(o.tmp_name_);
  dir_ = std::move(o.dir_);
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
    ::unlinkat(dir_.get(), tmp_name_.c_str(), 0);
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
    ::unlinkat(dir_.get(), tmp_name_.c_str(), 0);
    error_ = Status::Io(tmp_ + ": close failed: " + errno_string(e));
    return error_;
  }
  // Checked again just before the rename: the name may have changed since Create().
  s = check_replaceable(dir_.get(), name_, path_);
  if (!s.ok()) {
    ::unlinkat(dir_.get(), tmp_name_.c_str(), 0);
    error_ = s;
    return s;
  }
  if (::renameat(dir_.get(), tmp_name_.c_str(), dir_.get(), name_.c_str()) != 0) {
    int e = errno;
    ::unlinkat(dir_.get(), tmp_name_.c_str(), 0);
    error_ = Status::Io(path_ + ": cannot rename " + tmp_ + " into place: " + errno_string(e));
    return error_;
  }
  committed_ = true;
  return fsync_fd(dir_.get(), parent_dir(path_));
}

Status write_file_atomic(const std::string& path, const void* data, size_t n) {
  ZOE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
  ZOE_RETURN_IF_ERROR(f.append(data, n));
  return f.commit();
}

}  // namespace zoe

#include "common/posix_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace zoe {

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r returns the message, which may or may not live in buf.
  const char* m = strerror_r(err, buf, sizeof(buf));
  return m;
}

Status open_error(const std::string& path, const std::string& what, int err) {
  std::string msg = path + ": cannot " + what + ": " + errno_string(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
    case EACCES:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
      return Status::Invalid(std::move(msg));
    default:
      return Status::Io(std::move(msg));
  }
}

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    // Linux transfers at most 0x7ffff000 bytes per call.
    size_t chunk = std::min<size_t>(n - done, size_t{1} << 30);
    ssize_t w = ::write(fd, p + done, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      return Status::Io(path + ": write failed after " + std::to_string(done) + " of " +
                        std::to_string(n) + " bytes: " + errno_string(e));
    }
    if (w == 0)
      return Status::Io(path + ": write made no progress after " + std::to_string(done) + " of " +
                        std::to_string(n) + " bytes");
    done += static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status pread_all(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    size_t chunk = std::min<size_t>(n - done, size_t{1} << 30);
    ssize_t r = ::pread(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      return Status::Io(path + ": read failed at offset " + std::to_string(offset + done) + ": " +
                        errno_string(e));
    }
    if (r == 0)
      return Status::Io(path + ": unexpected end of file at offset " +
                        std::to_string(offset + done) + " (wanted " + std::to_string(n) +
                        " bytes from offset " + std::to_string(offset) + ")");
    done += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Result<size_t> read_upto(int fd, void* buf, size_t n, const std::string& path) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    size_t chunk = std::min<size_t>(n - done, size_t{1} << 30);
    ssize_t r = ::read(fd, p + done, chunk);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      return Status::Io(path + ": read failed: " + errno_string(e));
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

Status fsync_fd(int fd, const std::string& path) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    int e = errno;
    return Status::Io(path + ": fsync failed: " + errno_string(e));
  }
  return Status::Ok();
}

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return open_error(dir, "open directory for fsync", errno);
  Status s = fsync_fd(fd, dir);
  ::close(fd);
  return s;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace zoe

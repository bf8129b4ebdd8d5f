#include "common/posix_io.h"

#include <fcntl.h>
#include <sys/stat.h>
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

std::string base_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    default: return "not a regular file";
  }
}

Result<InputFile> open_input_file(const std::string& path, const std::string& what, uint64_t max_bytes, Links links) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before fstat could refuse it.
  int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (links == Links::kRefuse ? O_NOFOLLOW : 0);
  InputFile f;
  f.fd.reset(::open(path.c_str(), flags));
  if (!f.fd.valid()) {
    int e = errno;
    if (e == ELOOP && links == Links::kRefuse)
      return Status::Invalid(what + " '" + path + "': is a symbolic link, which zoe does not follow here");
    return open_error(path, "open (" + what + ")", e);
  }
  struct stat st;
  if (::fstat(f.fd.get(), &st) != 0) return Status::Io(path + ": cannot stat: " + errno_string(errno));
  if (!S_ISREG(st.st_mode))
    return Status::Invalid(what + " '" + path + "': is " + file_kind(st.st_mode) + ", not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return Status::Invalid(what + " '" + path + "': " + std::to_string(st.st_size) + " bytes, more than the " +
                           std::to_string(max_bytes) + " such a file may have");
  int fl = ::fcntl(f.fd.get(), F_GETFL);
  if (fl < 0 || ::fcntl(f.fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0)
    return Status::Io(path + ": cannot clear O_NONBLOCK: " + errno_string(errno));
  f.size = static_cast<uint64_t>(st.st_size);
  return f;
}

Status make_private_dirs(const std::string& path) {
  if (path.empty()) return Status::Invalid("an empty directory path");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return Status::Invalid(path + ": exists and is " + file_kind(st.st_mode) + ", not a directory");
    return Status::Ok();
  }
  if (errno != ENOENT) return open_error(path, "stat", errno);
  std::string parent = parent_dir(path);
  if (parent != path && parent != "." && parent != "/") ZOE_RETURN_IF_ERROR(make_private_dirs(parent));
  if (::mkdir(path.c_str(), 0700) != 0) {
    if (errno == EEXIST) return make_private_dirs(path);  // made by someone else meanwhile: check it
    return open_error(path, "create directory", errno);
  }
  // mkdir's mode passed the umask; a directory zoe made is its owner's alone whatever the umask.
  if (::chmod(path.c_str(), 0700) != 0) return open_error(path, "set mode 0700 on", errno);
  return Status::Ok();
}

Status check_replaceable(int dirfd, const std::string& name, const std::string& path) {
  struct stat st;
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return open_error(path, "stat", errno);
  }
  if (S_ISREG(st.st_mode)) return Status::Ok();
  return Status::Invalid(path + ": exists and is " + file_kind(st.st_mode) +
                         "; zoe replaces only a regular file there, and leaves this alone");
}

}  // namespace zoe

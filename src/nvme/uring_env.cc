#include "nvme/uring_env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/posix_io.h"
#include "nvme/io_error.h"
#include "nvme/uring_queue.h"

namespace zoe {

NvmeEnv* NvmeEnv::Default() {
  static UringEnv env;
  return &env;
}

Status UringEnv::create_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return open_error(path, "stat the directory", errno);
    if (!S_ISDIR(st.st_mode)) return Status::Invalid(path + ": exists and is not a directory");
    return Status::Ok();
  }
  return open_error(path, "create the directory", errno);
}

Result<std::string> UringEnv::resolve(const std::string& path, bool* was_link) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return open_error(path, "stat", errno);
  *was_link = S_ISLNK(st.st_mode);
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) return open_error(path, "resolve (realpath)", errno);
  std::string out(real);
  std::free(real);
  return out;
}

Result<Dir> UringEnv::open_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return open_error(path, "open the directory", errno);
  return Dir{fd, path};
}

Result<bool> UringEnv::make_dir_at(const Dir& dir, const std::string& name) {
  if (::mkdirat(dir.fd, name.c_str(), 0700) == 0) return true;
  if (errno == EEXIST) return false;
  return open_error(dir.at(name), "create the directory", errno);
}

Result<Dir> UringEnv::open_dir_at(const Dir& dir, const std::string& name) {
  const int fd = ::openat(dir.fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) return Dir{fd, dir.at(name)};
  const int e = errno;
  if (e == ELOOP || e == ENOTDIR)
    return Status::Invalid(dir.at(name) + ": is a symbolic link or not a directory (open with O_NOFOLLOW: " +
                           errno_text(e) + "); zoe does not follow links inside nvme_path");
  return open_error(dir.at(name), "open the directory", e);
}

Result<EntryInfo> UringEnv::stat_at(const Dir& dir, const std::string& name) {
  struct stat st;
  const int flags = name.empty() ? AT_EMPTY_PATH : AT_SYMLINK_NOFOLLOW;
  if (::fstatat(dir.fd, name.c_str(), &st, flags) != 0) {
    if (errno == ENOENT) return EntryInfo{};
    return open_error(name.empty() ? dir.path : dir.at(name), "stat", errno);
  }
  EntryInfo info;
  info.kind = S_ISDIR(st.st_mode) ? EntryInfo::Kind::kDir
              : S_ISREG(st.st_mode) ? EntryInfo::Kind::kFile
              : S_ISLNK(st.st_mode) ? EntryInfo::Kind::kLink
                                    : EntryInfo::Kind::kOther;
  info.owner = st.st_uid;
  info.mode = st.st_mode & 07777;
  info.bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  return info;
}

Status UringEnv::make_private(const Dir& dir) {
  if (::fchmod(dir.fd, 0700) == 0) return Status::Ok();
  return Status::Io(dir.path + ": cannot set mode 0700 (fchmod): " + errno_text(errno));
}

Result<bool> UringEnv::try_lock(const Dir& dir) {
  while (::flock(dir.fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return false;
    return Status::Io(dir.path + ": cannot lock the directory (flock): " + errno_text(errno));
  }
  return true;
}

Status UringEnv::create_file_at(const Dir& dir, const std::string& name) {
  const int fd = ::openat(dir.fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return open_error(dir.at(name), "create", errno);
  ::close(fd);
  return Status::Ok();
}

Result<std::vector<std::string>> UringEnv::list_dir(const Dir& dir) {
  // fdopendir takes its descriptor: a duplicate, so that `dir` stays open (and locked).
  const int fd = ::fcntl(dir.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return Status::Io(dir.path + ": cannot list the directory (dup): " + errno_text(errno));
  DIR* d = ::fdopendir(fd);
  if (!d) {
    const int e = errno;
    ::close(fd);
    return open_error(dir.path, "list the directory", e);
  }
  ::rewinddir(d);  // the duplicate shares the position of `dir`, which an earlier listing moved
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    errno = 0;
  }
  const int e = errno;
  ::closedir(d);
  if (e != 0) return Status::Io(dir.path + ": cannot list the directory (readdir): " + errno_text(e));
  return names;
}

Result<DirectFile> UringEnv::create_direct_at(const Dir& dir, const std::string& name) {
  const std::string path = dir.at(name);
  DirectFile f;
  f.fd = ::openat(dir.fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_DIRECT | O_CLOEXEC, 0600);
  if (f.fd < 0) {
    const int e = errno;
    if (e == EINVAL)
      return Status::Invalid(path + ": the file system does not support O_DIRECT (open: " + errno_text(e) +
                             "); put nvme_path on a local file system such as ext4 or xfs");
    if (e == EEXIST)
      return Status::Invalid(path + ": exists already (a file or link not removed by the store); zoe creates swap "
                             "files fresh and never opens one it did not create");
    return open_error(path, "create the swap file", e);
  }
  // The kernel says what direct I/O needs on this file (Linux 6.1+); 4 KiB is safe elsewhere.
  struct statx stx;
  std::memset(&stx, 0, sizeof stx);
  if (::statx(f.fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
      stx.stx_dio_offset_align != 0 && stx.stx_dio_mem_align != 0) {
    f.mem_align = stx.stx_dio_mem_align;
    f.offset_align = stx.stx_dio_offset_align;
  }
  return f;
}

Status UringEnv::allocate(int fd, const std::string& path, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  while (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    if (errno == EINTR) continue;
    const int e = errno;
    std::string msg = path + ": cannot reserve " + std::to_string(bytes) + " bytes (fallocate): " + errno_text(e);
    if (e == EOPNOTSUPP)
      msg += "; zoe preallocates swap files so that writes cannot run out of space: use a file system "
             "with fallocate (ext4, xfs)";
    return Status::Io(msg);
  }
  return Status::Ok();
}

Result<uint64_t> UringEnv::free_bytes(const Dir& dir) {
  struct statvfs v;
  if (::fstatvfs(dir.fd, &v) != 0) return open_error(dir.path, "query free space (fstatvfs)", errno);
  return static_cast<uint64_t>(v.f_bavail) * static_cast<uint64_t>(v.f_frsize);
}

Status UringEnv::remove_file_at(const Dir& dir, const std::string& name) {
  if (::unlinkat(dir.fd, name.c_str(), 0) == 0 || errno == ENOENT) return Status::Ok();
  return Status::Io(dir.at(name) + ": cannot remove (unlinkat): " + errno_text(errno));
}

Status UringEnv::remove_dir_at(const Dir& dir, const std::string& name) {
  if (::unlinkat(dir.fd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return Status::Ok();
  return Status::Io(dir.at(name) + ": cannot remove the directory (unlinkat): " + errno_text(errno));
}

void UringEnv::close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

Result<std::unique_ptr<IoQueue>> UringEnv::new_queue(unsigned depth) {
  ZOE_ASSIGN_OR_RETURN(std::unique_ptr<UringQueue> q, UringQueue::create(depth));
  return std::unique_ptr<IoQueue>(std::move(q));
}

}  // namespace zoe

#include "nvme/uring_env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
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

Result<int> UringEnv::lock_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return open_error(path, "open the directory to lock it", errno);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int e = errno;
    ::close(fd);
    if (e == EWOULDBLOCK)
      return Status::Invalid(path + ": in use by another zoe job or store (flock LOCK_EX|LOCK_NB: " +
                             errno_text(e) + "); two jobs cannot share swap files: give each its own "
                             "nvme_path or job name");
    return Status::Io(path + ": cannot lock the directory (flock): " + errno_text(e));
  }
  return fd;
}

Result<std::vector<std::string>> UringEnv::list_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return open_error(path, "list the directory", errno);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

Result<DirectFile> UringEnv::open_direct(const std::string& path) {
  DirectFile f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (f.fd < 0) {
    const int e = errno;
    if (e == EINVAL)
      return Status::Invalid(path + ": the file system does not support O_DIRECT (open: " + errno_text(e) +
                             "); put nvme_path on a local file system such as ext4 or xfs");
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

Result<uint64_t> UringEnv::free_bytes(const std::string& path) {
  struct statvfs v;
  if (::statvfs(path.c_str(), &v) != 0) return open_error(path, "query free space (statvfs)", errno);
  return static_cast<uint64_t>(v.f_bavail) * static_cast<uint64_t>(v.f_frsize);
}

Status UringEnv::remove_file(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::Ok();
  return Status::Io(path + ": cannot remove (unlink): " + errno_text(errno));
}

Status UringEnv::remove_dir(const std::string& path) {
  if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return Status::Ok();
  return Status::Io(path + ": cannot remove the directory (rmdir): " + errno_text(errno));
}

void UringEnv::close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

Result<std::unique_ptr<IoQueue>> UringEnv::new_queue(unsigned depth) {
  ZOE_ASSIGN_OR_RETURN(std::unique_ptr<UringQueue> q, UringQueue::create(depth));
  return std::unique_ptr<IoQueue>(std::move(q));
}

}  // namespace zoe

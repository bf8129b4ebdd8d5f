// NvmeEnv: everything the NVMe tier asks of the operating system, behind one interface so that
// tests can inject faults (leveldb's Env is the model). Storage knows files and byte ranges,
// never tensors. The real environment is UringEnv (POSIX calls + io_uring queues).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/io_queue.h"
#include "zoe/status.h"

namespace zoe {

// An open O_DIRECT file and the alignments the kernel asks of direct I/O on it.
struct DirectFile {
  int fd = -1;
  uint32_t mem_align = 4096;     // buffer address alignment
  uint32_t offset_align = 4096;  // file offset and length alignment
};

class NvmeEnv {
 public:
  virtual ~NvmeEnv() = default;

  // The io_uring environment; stateless, lives for the whole process.
  static NvmeEnv* Default();

  // mkdir of one level; an existing directory is fine.
  virtual Status create_dir(const std::string& path) = 0;
  // Opens the directory and takes flock(LOCK_EX | LOCK_NB) on it; the returned descriptor holds
  // the lock until it is closed. A directory locked elsewhere (another job, or another store in
  // this process) is an error naming it.
  virtual Result<int> lock_dir(const std::string& path) = 0;
  // Names of the entries of a directory (without "." and "..").
  virtual Result<std::vector<std::string>> list_dir(const std::string& path) = 0;
  // Creates (or truncates) a file for direct I/O: O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, with the
  // alignments of statx(STATX_DIOALIGN), 4 KiB where the file system does not say.
  virtual Result<DirectFile> open_direct(const std::string& path) = 0;
  // Reserves the first `bytes` of the file (fallocate mode 0): later writes inside cannot fail
  // for want of space, and the file's size becomes `bytes`.
  virtual Status allocate(int fd, const std::string& path, uint64_t bytes) = 0;
  // Bytes an unprivileged writer may still use on the file system holding `path` (statvfs).
  virtual Result<uint64_t> free_bytes(const std::string& path) = 0;
  virtual Status remove_file(const std::string& path) = 0;
  virtual Status remove_dir(const std::string& path) = 0;
  virtual void close_fd(int fd) = 0;
  // A submission queue of `depth` requests (io_uring in the real environment).
  virtual Result<std::unique_ptr<IoQueue>> new_queue(unsigned depth) = 0;
};

}  // namespace zoe

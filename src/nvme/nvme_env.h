// NvmeEnv: everything the NVMe tier asks of the operating system, behind one interface so that
// tests can inject faults (leveldb's Env is the model). Storage knows files and byte ranges,
// never tensors. The real environment is UringEnv (POSIX calls + io_uring queues).
//
// Inside nvme_path every call works on an open directory (Dir) and a plain name in it, never on a
// path: a name is resolved once, by the kernel, against a directory the store has checked, and no
// call follows a symbolic link there (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW), so a link planted in a
// shared nvme_path or in a swap directory cannot redirect a create, a truncate or an unlink to a
// file elsewhere.
#pragma once
#include <sys/types.h>

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

// An open directory: its descriptor, and its path for messages only.
struct Dir {
  int fd = -1;
  std::string path;
  std::string at(const std::string& name) const { return path + "/" + name; }
};

// What lstat says of an entry (the entry itself, never a link's target).
struct EntryInfo {
  enum class Kind { kMissing, kDir, kFile, kLink, kOther };
  Kind kind = Kind::kMissing;
  uid_t owner = 0;
  mode_t mode = 0;  // permission bits only
  uint64_t bytes = 0;  // allocated on disk (st_blocks x 512): what removing it frees
};

class NvmeEnv {
 public:
  virtual ~NvmeEnv() = default;

  // The io_uring environment; stateless, lives for the whole process.
  static NvmeEnv* Default();

  // mkdir of one level (mode 0700); an existing directory is fine. For nvme_path and its parents,
  // which are the user's to name.
  virtual Status create_dir(const std::string& path) = 0;
  // realpath(path); *was_link says whether `path` itself is a symbolic link.
  virtual Result<std::string> resolve(const std::string& path, bool* was_link) = 0;
  // Opens a directory by path, not following a last component that is a link.
  virtual Result<Dir> open_dir(const std::string& path) = 0;
  // mkdirat(dir, name, 0700): true when made, false when something of that name exists.
  virtual Result<bool> make_dir_at(const Dir& dir, const std::string& name) = 0;
  // Opens the directory `name` inside `dir` (O_NOFOLLOW): a link there is Invalid.
  virtual Result<Dir> open_dir_at(const Dir& dir, const std::string& name) = 0;
  // lstat of `name` inside `dir`, or of `dir` itself when `name` is empty.
  virtual Result<EntryInfo> stat_at(const Dir& dir, const std::string& name) = 0;
  // fchmod(dir, 0700): a directory the store made is its owner's only, whatever the umask.
  virtual Status make_private(const Dir& dir) = 0;
  // flock(LOCK_EX | LOCK_NB) on the directory: true when taken (held until the descriptor is
  // closed), false when another descriptor holds it (another job, or another store here).
  virtual Result<bool> try_lock(const Dir& dir) = 0;
  // Creates an empty regular file (O_CREAT | O_EXCL | O_NOFOLLOW, 0600) and closes it.
  virtual Status create_file_at(const Dir& dir, const std::string& name) = 0;
  // Names of the entries of a directory (without "." and "..").
  virtual Result<std::vector<std::string>> list_dir(const Dir& dir) = 0;
  // Creates a new file for direct I/O: O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_DIRECT, with
  // the alignments of statx(STATX_DIOALIGN), 4 KiB where the file system does not say. An
  // existing entry of that name (a file left behind, or a planted link) is an error, not reused.
  virtual Result<DirectFile> create_direct_at(const Dir& dir, const std::string& name) = 0;
  // Reserves the first `bytes` of the file (fallocate mode 0): later writes inside cannot fail
  // for want of space, and the file's size becomes `bytes`.
  virtual Status allocate(int fd, const std::string& path, uint64_t bytes) = 0;
  // Bytes an unprivileged writer may still use on the file system holding `dir` (fstatvfs).
  virtual Result<uint64_t> free_bytes(const Dir& dir) = 0;
  // unlinkat of a file or (remove_dir_at) an empty directory inside `dir`; a missing one is fine.
  // A link is removed itself, never its target.
  virtual Status remove_file_at(const Dir& dir, const std::string& name) = 0;
  virtual Status remove_dir_at(const Dir& dir, const std::string& name) = 0;
  virtual void close_fd(int fd) = 0;
  // A submission queue of `depth` requests (io_uring in the real environment).
  virtual Result<std::unique_ptr<IoQueue>> new_queue(unsigned depth) = 0;
};

}  // namespace zoe

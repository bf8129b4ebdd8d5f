// Crash-safe replacement of one file, safe against a hostile neighbour in the same directory.
//
// Create() opens the directory that will hold <path>, checks that <path> is absent or a regular
// file (a link, device, FIFO or directory there is Invalid, and left alone), and creates a new
// temporary file "<name>.tmp.<pid>.<16 random hex>" beside it with O_CREAT|O_EXCL|O_NOFOLLOW, mode
// 0600 whatever the umask: a link or file planted at any name is never opened. append() writes
// to it; commit()
//   1. fsyncs and closes the temporary file,
//   2. renames it over <path> (relative to the directory's descriptor),
//   3. fsyncs that directory.
// A crash (or failure) before step 2 leaves <path> exactly as it was (old contents, or absent)
// plus possibly a stray, incomplete temporary file; from step 2 on <path> holds the complete new
// contents. <path> never holds a partial file. Failures (ENOSPC, EIO, short writes) are
// Status::Io naming the path and strerror, and remove the temporary file; so does destroying an
// uncommitted AtomicFile. A stray temporary file of a crashed process is left for the caller to
// delete; it is never read. One writer per path at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/checksum.h"
#include "common/unique_fd.h"
#include "zoe/status.h"

namespace zoe {

class AtomicFile {
 public:
  static Result<AtomicFile> Create(const std::string& path);

  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&& o) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // abort() unless committed

  // After a failed append() the file is aborted and every later call returns that error.
  Status append(const void* data, size_t n);
  Status append(std::string_view s) { return append(s.data(), s.size()); }
  Status commit();
  void abort();  // closes and removes the temporary file

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }
  uint64_t bytes_written() const { return bytes_; }
  std::string checksum_hex() const { return sum_.hex(); }  // xxh3-64 of the bytes appended

 private:
  AtomicFile() = default;

  std::string path_;
  std::string tmp_;
  std::string name_, tmp_name_;  // path_'s and tmp_'s last components, relative to dir_
  UniqueFd dir_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  Checksum sum_;
  Status error_;
  bool committed_ = false;
};

// Writes `data` to `path` through an AtomicFile.
Status write_file_atomic(const std::string& path, const void* data, size_t n);
inline Status write_file_atomic(const std::string& path, std::string_view data) {
  return write_file_atomic(path, data.data(), data.size());
}

}  // namespace zoe

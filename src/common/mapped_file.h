// A whole regular file, read-only: memory-mapped, or read into memory where it cannot be mapped
// (/proc files that report size 0, file systems without mmap). A FIFO, device, socket or directory
// is refused on the opened descriptor (never read, never waited on), as is a file past max_bytes.
// A file truncated while mapped raises SIGBUS on the next read of a vanished page: under
// SignalExit (the `zoe` command) that is one line naming the file and exit 1, via PathOfAddress.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe {

class MappedFile {
 public:
  // Open failures: Invalid for a missing/unreadable path or a directory, Io otherwise.
  // `what` names the file's role in messages, e.g. "config key 'zoe.init'".
  static Result<MappedFile> Open(const std::string& path, const std::string& what = "file",
                                 uint64_t max_bytes = UINT64_MAX);

  // The path of the live mapping that holds `addr`, copied to out[0, n) (async-signal-safe: for a
  // SIGBUS handler); false when no MappedFile maps it.
  static bool PathOfAddress(const void* addr, char* out, size_t n);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }  // null when size() == 0
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool mapped() const { return map_ != nullptr; }  // false: the bytes were read into memory

 private:
  void release();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;        // mmap base, when mapped
  int slot_ = -1;              // its entry in the table PathOfAddress reads
  std::vector<uint8_t> heap_;  // contents, when read
};

}  // namespace zoe

// A whole file, read-only, memory-mapped when it is a regular file and read into memory
// otherwise (pipes, character devices, /proc files that report size 0).
// The file must not be truncated while mapped (reading a vanished page raises SIGBUS).
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
  static Result<MappedFile> Open(const std::string& path);

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
  std::vector<uint8_t> heap_;  // contents, when read
};

}  // namespace zoe

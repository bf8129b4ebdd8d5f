// xxh3-64 checksums (seed 0), written as 16 lower-case hex digits, as checkpoint manifests store them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zoe/status.h"

namespace zoe {

// Streaming xxh3-64 over any number of update() calls.
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(Checksum&&) noexcept;
  Checksum& operator=(Checksum&&) noexcept;

  void update(const void* data, size_t n);
  uint64_t digest() const;  // of everything so far; update() may continue afterwards
  void reset();             // back to the empty input, keeping the state's memory
  std::string hex() const { return checksum_to_hex(digest()); }

  static std::string checksum_to_hex(uint64_t h);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// xxh3-64 of a memory buffer.
uint64_t xxh3_64(const void* data, size_t n);

// xxh3-64 of a memory buffer, as 16 hex digits.
std::string checksum_buffer(const void* data, size_t n);

// xxh3-64 of a file's contents, read in 8 MiB chunks; Invalid/Io naming the file on failure.
Result<std::string> checksum_file(const std::string& path);

}  // namespace zoe

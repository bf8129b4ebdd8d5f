#include "ckpt/checksum.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <new>
#include <vector>

#include "common/posix_io.h"

namespace zoe {

struct Checksum::State {
  XXH3_state_t* st = nullptr;
  State() : st(XXH3_createState()) {
    if (!st) throw std::bad_alloc();
    XXH3_64bits_reset(st);
  }
  ~State() { XXH3_freeState(st); }
};

Checksum::Checksum() : s_(std::make_unique<State>()) {}
Checksum::~Checksum() = default;
Checksum::Checksum(Checksum&&) noexcept = default;
Checksum& Checksum::operator=(Checksum&&) noexcept = default;

void Checksum::update(const void* data, size_t n) {
  if (n) XXH3_64bits_update(s_->st, data, n);
}

uint64_t Checksum::digest() const { return XXH3_64bits_digest(s_->st); }

std::string Checksum::checksum_to_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string checksum_buffer(const void* data, size_t n) {
  return Checksum::checksum_to_hex(XXH3_64bits(data, n));
}

Result<std::string> checksum_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return open_error(path, "open for checksum", errno);
  constexpr size_t kChunk = size_t{8} << 20;
  std::vector<uint8_t> buf(kChunk);
  Checksum sum;
  for (;;) {
    Result<size_t> r = read_upto(fd, buf.data(), kChunk, path);
    if (!r.ok()) {
      ::close(fd);
      return r.status();
    }
    sum.update(buf.data(), r.value());
    if (r.value() < kChunk) break;
  }
  ::close(fd);
  return sum.hex();
}

}  // namespace zoe

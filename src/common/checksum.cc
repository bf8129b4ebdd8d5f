#include "common/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#if defined(__x86_64__)
#define XXH_DISPATCH_DISABLE_REPLACE 1  // the _dispatch entry points are called by name below
#include <xxh_x86dispatch.h>
#else
#include <xxhash.h>
#define XXH3_64bits_dispatch XXH3_64bits
#define XXH3_64bits_update_dispatch XXH3_64bits_update
#endif

#include <cerrno>
#include <cstdio>
#include <memory>
#include <new>

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

// Debian's libxxhash is built for baseline x86-64: XXH3_64bits and XXH3_64bits_update run its
// SSE2 loop. The _dispatch entry points pick AVX2 or AVX-512 at run time and give the same hash,
// about 4x faster here (19 vs 5 GB/s): every swap block is hashed as written and as read.
void Checksum::update(const void* data, size_t n) {
  if (n) XXH3_64bits_update_dispatch(s_->st, data, n);
}

uint64_t Checksum::digest() const { return XXH3_64bits_digest(s_->st); }

void Checksum::reset() { XXH3_64bits_reset(s_->st); }

std::string Checksum::checksum_to_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

uint64_t xxh3_64(const void* data, size_t n) { return XXH3_64bits_dispatch(data, n); }

std::string checksum_buffer(const void* data, size_t n) { return Checksum::checksum_to_hex(xxh3_64(data, n)); }

Result<std::string> checksum_file(const std::string& path) {
  ZOE_ASSIGN_OR_RETURN(InputFile in, open_input_file(path, "file to checksum", UINT64_MAX));
  constexpr size_t kChunk = size_t{8} << 20;
  // Not a zero-filled vector: only the pages a read fills are touched, so checking the many small
  // or empty files of a wide checkpoint does not cost 8 MiB of memset each.
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kChunk]);
  Checksum sum;
  for (;;) {
    Result<size_t> r = read_upto(in.fd.get(), buf.get(), kChunk, path);
    if (!r.ok()) return r.status();
    sum.update(buf.get(), r.value());
    if (r.value() < kChunk) break;
  }
  return sum.hex();
}

}  // namespace zoe

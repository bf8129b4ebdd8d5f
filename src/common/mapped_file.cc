#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "common/posix_io.h"

namespace zoe {

namespace {

// Reads fd to end of file into *out, at most max_bytes (Invalid past that).
Status read_to_end(int fd, const std::string& path, const std::string& what, uint64_t max_bytes,
                   std::vector<uint8_t>* out) {
  out->clear();
  size_t cap = 1 << 16;
  for (;;) {
    size_t old = out->size();
    out->resize(old + cap);
    Result<size_t> r = read_upto(fd, out->data() + old, cap, path);
    if (!r.ok()) return r.status();
    out->resize(old + r.value());
    if (out->size() > max_bytes)
      return Status::Invalid(what + " '" + path + "': more than the " + std::to_string(max_bytes) +
                             " bytes such a file may have");
    if (r.value() < cap) return Status::Ok();
    if (cap < (size_t{1} << 26)) cap *= 2;
  }
}

// The live mappings, for PathOfAddress in a signal handler: a fixed table of atomics (a handler may
// not lock or allocate). A slot is claimed (state 1), filled, then published (state 2).
constexpr int kSlots = 256;
struct Slot {
  std::atomic<int> state{0};
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> bytes{0};
  char path[512];
};
std::array<Slot, kSlots> g_slots;

int publish(const void* base, size_t bytes, const std::string& path) {
  for (int i = 0; i < kSlots; ++i) {
    int free = 0;
    if (!g_slots[i].state.compare_exchange_strong(free, 1)) continue;
    std::snprintf(g_slots[i].path, sizeof g_slots[i].path, "%s", path.c_str());
    g_slots[i].base.store(reinterpret_cast<uintptr_t>(base));
    g_slots[i].bytes.store(bytes);
    g_slots[i].state.store(2);
    return i;
  }
  return -1;  // more than kSlots files mapped at once: a fault there is reported as a plain SIGBUS
}

}  // namespace

bool MappedFile::PathOfAddress(const void* addr, char* out, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (Slot& s : g_slots) {
    if (s.state.load() != 2) continue;
    uintptr_t b = s.base.load();
    if (a < b || a >= b + s.bytes.load()) continue;
    size_t i = 0;
    for (; i + 1 < n && s.path[i]; ++i) out[i] = s.path[i];
    if (n) out[i] = '\0';
    return true;
  }
  return false;
}

Result<MappedFile> MappedFile::Open(const std::string& path, const std::string& what, uint64_t max_bytes) {
  ZOE_ASSIGN_OR_RETURN(InputFile in, open_input_file(path, what, max_bytes));
  MappedFile f;
  f.path_ = path;
  if (in.size > 0) {
    size_t n = static_cast<size_t>(in.size);
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, in.fd.get(), 0);
    if (p != MAP_FAILED) {
      f.map_ = p;
      f.data_ = static_cast<const uint8_t*>(p);
      f.size_ = n;
      f.slot_ = publish(p, n, path);
      return f;
    }
    // Some file systems cannot map; fall through and read instead.
  }
  ZOE_RETURN_IF_ERROR(read_to_end(in.fd.get(), path, what, max_bytes, &f.heap_));
  f.size_ = f.heap_.size();
  f.data_ = f.size_ ? f.heap_.data() : nullptr;
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this == &o) return *this;
  release();
  path_ = std::move(o.path_);
  size_ = std::exchange(o.size_, 0);
  map_ = std::exchange(o.map_, nullptr);
  slot_ = std::exchange(o.slot_, -1);
  heap_ = std::move(o.heap_);
  o.heap_.clear();
  o.data_ = nullptr;
  data_ = map_ ? static_cast<const uint8_t*>(map_) : (size_ ? heap_.data() : nullptr);
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (slot_ >= 0) g_slots[slot_].state.store(0);  // unpublished before the pages go
  slot_ = -1;
  if (map_) ::munmap(map_, size_);
  map_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  heap_.clear();
}

}  // namespace zoe

#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "common/posix_io.h"

namespace zoe {

namespace {

// Reads fd to end of file into *out.
Status read_to_end(int fd, const std::string& path, std::vector<uint8_t>* out) {
  out->clear();
  size_t cap = 1 << 16;
  for (;;) {
    size_t old = out->size();
    out->resize(old + cap);
    Result<size_t> r = read_upto(fd, out->data() + old, cap, path);
    if (!r.ok()) return r.status();
    out->resize(old + r.value());
    if (r.value() < cap) return Status::Ok();
    if (cap < (size_t{1} << 26)) cap *= 2;
  }
}

}  // namespace

Result<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return open_error(path, "open", errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::Io(path + ": cannot stat: " + errno_string(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::Invalid(path + ": is a directory, not a file");
  }
  MappedFile f;
  f.path_ = path;
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    size_t n = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      ::close(fd);
      f.map_ = p;
      f.data_ = static_cast<const uint8_t*>(p);
      f.size_ = n;
      return f;
    }
    // Some file systems cannot map; fall through and read instead.
  }
  Status s = read_to_end(fd, path, &f.heap_);
  ::close(fd);
  ZOE_RETURN_IF_ERROR(s);
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
  heap_ = std::move(o.heap_);
  o.heap_.clear();
  o.data_ = nullptr;
  data_ = map_ ? static_cast<const uint8_t*>(map_) : (size_ ? heap_.data() : nullptr);
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (map_) ::munmap(map_, size_);
  map_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  heap_.clear();
}

}  // namespace zoe

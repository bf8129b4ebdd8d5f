#include "data/token_source.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/posix_io.h"

namespace zoe {

static_assert(std::endian::native == std::endian::little, "token shards are read in place as little-endian");

Result<TokenFormat> parse_token_format(std::string_view s) {
  if (s == "bytes") return TokenFormat::kBytes;
  if (s == "llmc") return TokenFormat::kLlmc;
  return Status::Invalid("unknown data format '" + std::string(s) + "' (expected bytes or llmc)");
}

std::string_view token_format_name(TokenFormat f) { return f == TokenFormat::kBytes ? "bytes" : "llmc"; }

namespace {

Result<std::vector<std::string>> expand(const std::string& pattern) {
  if (pattern.empty()) return Status::Invalid("data path is empty");
  struct stat st;
  if (::lstat(pattern.c_str(), &st) == 0) return std::vector<std::string>{pattern};
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty()))
    return Status::Invalid(pattern + ": no such file, and no files match it as a glob pattern");
  if (rc == GLOB_NOSPACE) return Status::OutOfMemory(pattern + ": out of memory expanding the glob");
  if (rc != 0) return Status::Io(pattern + ": read error while expanding the glob");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Status TokenSource::add_shard(const std::string& path) {
  ZOE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path, "data file"));
  const uint64_t size = file.size();
  if (size == 0) return Status::Invalid(path + ": empty file (no tokens)");
  Shard sh;
  sh.path = path;
  if (format_ == TokenFormat::kBytes) {
    sh.ntok = size;
    if (vocab_size_ < 256) {
      const uint8_t* t = file.data();
      for (uint64_t i = 0; i < sh.ntok; ++i)
        if (t[i] >= vocab_size_)
          return Status::Invalid(path + ": byte " + std::to_string(t[i]) + " at position " +
                                 std::to_string(i) + " is not below vocab_size " +
                                 std::to_string(vocab_size_));
    }
  } else {
    ZOE_ASSIGN_OR_RETURN(sh.ntok, check_llmc_shard(file.data(), size, vocab_size_, path));
    sh.first = kLlmcHeaderBytes;
  }
  // Reads go through a descriptor of their own (open_shard), each token checked again (copy()):
  // the mapping is gone before training starts, so a file changed later cannot reach the model
  // unchecked.
  shards_.push_back(std::move(sh));
  return Status::Ok();
}

Result<TokenSource> TokenSource::Open(TokenFormat format, const std::string& pattern,
                                      int64_t vocab_size) {
  if (vocab_size <= 0)
    return Status::Invalid("vocab_size must be positive, got " + std::to_string(vocab_size));
  TokenSource src;
  src.format_ = format;
  src.vocab_size_ = vocab_size;
  ZOE_ASSIGN_OR_RETURN(std::vector<std::string> paths, expand(pattern));
  for (const std::string& p : paths) ZOE_RETURN_IF_ERROR(src.add_shard(p));
  return src;
}

uint64_t TokenSource::total_tokens() const {
  uint64_t n = 0;
  for (const Shard& s : shards_) n += s.ntok;
  return n;
}

Status TokenSource::open_shard(size_t i) const {
  if (open_index_ == i) return Status::Ok();
  open_fd_.reset();
  open_index_ = SIZE_MAX;
  Result<InputFile> in = open_input_file(shards_[i].path, "data file", UINT64_MAX);
  if (!in.ok()) return Status::Io("data file changed while the job ran: " + in.status().message());
  open_fd_ = std::move(in.value().fd);
  open_index_ = i;
  return Status::Ok();
}

Status TokenSource::copy(size_t i, uint64_t pos, size_t n, int32_t* out) const {
  const Shard& s = shards_[i];
  ZOE_RETURN_IF_ERROR(open_shard(i));
  const size_t width = format_ == TokenFormat::kBytes ? 1 : 2;
  uint8_t buf[8192];
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(n - done, sizeof(buf) / width);
    Status r = pread_all(open_fd_.get(), buf, k * width, s.first + (pos + done) * width, s.path);
    if (!r.ok()) return Status::Io("data file changed while the job ran: " + r.message());
    for (size_t j = 0; j < k; ++j) {
      const int32_t t = width == 1 ? buf[j] : int32_t{buf[2 * j]} | int32_t{buf[2 * j + 1]} << 8;
      // Checked again where it is used: it will index the embedding and the logits.
      if (t >= vocab_size_)
        return Status::Invalid(s.path + ": token " + std::to_string(t) + " at position " + std::to_string(pos + done + j) +
                               " is not below vocab_size " + std::to_string(vocab_size_) +
                               " (the data file changed after zoe checked it)");
      out[done + j] = t;
    }
    done += k;
  }
  return Status::Ok();
}

Result<int32_t> TokenSource::token(size_t i, uint64_t pos) const {
  int32_t v;
  ZOE_RETURN_IF_ERROR(copy(i, pos, 1, &v));
  return v;
}

}  // namespace zoe

#include "data/token_source.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cstring>

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

Status TokenSource::add_shard(MappedFile file) {
  const std::string& path = file.path();
  const uint64_t size = file.size();
  if (size == 0) return Status::Invalid(path + ": empty file (no tokens)");
  Shard sh;
  if (format_ == TokenFormat::kBytes) {
    sh.tokens = file.data();
    sh.ntok = size;
    if (vocab_size_ < 256) {
      const uint8_t* t = sh.tokens;
      for (uint64_t i = 0; i < sh.ntok; ++i)
        if (t[i] >= vocab_size_)
          return Status::Invalid(path + ": byte " + std::to_string(t[i]) + " at position " +
                                 std::to_string(i) + " is not below vocab_size " +
                                 std::to_string(vocab_size_));
    }
  } else {
    ZOE_ASSIGN_OR_RETURN(sh.ntok, check_llmc_shard(file.data(), size, vocab_size_, path));
    sh.tokens = file.data() + kLlmcHeaderBytes;
  }
  sh.file = std::move(file);
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
  for (const std::string& p : paths) {
    ZOE_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(p));
    ZOE_RETURN_IF_ERROR(src.add_shard(std::move(f)));
  }
  return src;
}

uint64_t TokenSource::total_tokens() const {
  uint64_t n = 0;
  for (const Shard& s : shards_) n += s.ntok;
  return n;
}

void TokenSource::copy(size_t i, uint64_t pos, size_t n, int32_t* out) const {
  const Shard& s = shards_[i];
  if (format_ == TokenFormat::kBytes) {
    const uint8_t* t = s.tokens + pos;
    for (size_t k = 0; k < n; ++k) out[k] = t[k];
  } else {
    const uint16_t* t = reinterpret_cast<const uint16_t*>(s.tokens) + pos;
    for (size_t k = 0; k < n; ++k) out[k] = t[k];
  }
}

int32_t TokenSource::token(size_t i, uint64_t pos) const {
  int32_t v;
  copy(i, pos, 1, &v);
  return v;
}

}  // namespace zoe

// The tokens of a training or validation data set: one or more shards, fully validated on Open()
// (through a mapping), then read with pread and every token checked again as it is read: a file
// rewritten in place (ids past the vocabulary) or truncated while a job runs is an error naming
// it, never an id that indexes past a table, never a SIGBUS.
//   bytes: any file; every byte is one token (vocab 256).
//   llmc:  llm.c token shards (data/llmc_shard.h), checked by check_llmc_shard.
// `pattern` is a path or a glob(3) pattern; a path that exists is taken literally, otherwise the
// glob's matches are the shards, in byte-wise sorted order.
// Every error is Invalid and names the file and the problem.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "common/unique_fd.h"
#include "data/llmc_shard.h"
#include "zoe/status.h"

namespace zoe {

enum class TokenFormat : uint8_t { kBytes, kLlmc };

Result<TokenFormat> parse_token_format(std::string_view s);  // "bytes" or "llmc"
std::string_view token_format_name(TokenFormat f);

class TokenSource {
 public:
  // Opens and checks every shard: format, size, non-empty, and every token < vocab_size (the
  // model's vocabulary; tokens are scanned unless the format cannot exceed it).
  static Result<TokenSource> Open(TokenFormat format, const std::string& pattern,
                                  int64_t vocab_size);

  TokenFormat format() const { return format_; }
  int64_t vocab_size() const { return vocab_size_; }
  size_t num_shards() const { return shards_.size(); }
  const std::string& shard_path(size_t i) const { return shards_[i].path; }
  uint64_t shard_tokens(size_t i) const { return shards_[i].ntok; }
  uint64_t total_tokens() const;

  // Reads tokens [pos, pos + n) of shard `i` into out as int32; requires pos + n <= shard_tokens(i).
  // One thread at a time (it keeps the shard being read open).
  // Invalid when a token read is not below the vocabulary, Io when the file ended early: either
  // means the file changed after Open() checked it, and the message says so.
  Status copy(size_t i, uint64_t pos, size_t n, int32_t* out) const;
  Result<int32_t> token(size_t i, uint64_t pos) const;

 private:
  struct Shard {
    std::string path;
    uint64_t first = 0;  // byte offset of the first token
    uint64_t ntok = 0;
  };
  // The shard being read, open: the loader reads one shard after another, so a data set of
  // thousands of shards holds one descriptor, not thousands (EMFILE).
  Status open_shard(size_t i) const;
  mutable UniqueFd open_fd_;
  mutable size_t open_index_ = SIZE_MAX;
  Status add_shard(const std::string& path);

  TokenFormat format_ = TokenFormat::kBytes;
  int64_t vocab_size_ = 0;
  std::vector<Shard> shards_;
};

}  // namespace zoe

// The tokens of a training or validation data set: one or more shards, memory-mapped and fully
// validated on Open().
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
  const std::string& shard_path(size_t i) const { return shards_[i].file.path(); }
  uint64_t shard_tokens(size_t i) const { return shards_[i].ntok; }
  uint64_t total_tokens() const;

  // Copies tokens [pos, pos + n) of shard `i` to out as int32; requires pos + n <= shard_tokens(i).
  void copy(size_t i, uint64_t pos, size_t n, int32_t* out) const;
  int32_t token(size_t i, uint64_t pos) const;

 private:
  struct Shard {
    MappedFile file;
    const uint8_t* tokens = nullptr;  // first token's first byte
    uint64_t ntok = 0;
  };
  Status add_shard(MappedFile file);

  TokenFormat format_ = TokenFormat::kBytes;
  int64_t vocab_size_ = 0;
  std::vector<Shard> shards_;
};

}  // namespace zoe

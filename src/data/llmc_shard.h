// llm.c token shards: a header of 256 little-endian int32 ([0] = 20240520 magic, [1] = 1 version,
// [2] = ntok), then ntok little-endian uint16 tokens; the file size is exactly 1024 + 2 * ntok.
// The check is a function of the bytes, not of a path, so that TokenSource (on the mapped file)
// and fuzz/fuzz_llmc.cc (on fuzzer input) run exactly the same code.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "zoe/status.h"

namespace zoe {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr size_t kLlmcHeaderBytes = 1024;

// data[0, size) is the whole shard (data may be null when size is 0). Returns its token count
// (> 0) when the header, the size and every token (< vocab_size, a positive vocabulary) are
// valid; otherwise Invalid, naming `name` and the problem.
Result<uint64_t> check_llmc_shard(const uint8_t* data, size_t size, int64_t vocab_size,
                                  const std::string& name);

}  // namespace zoe

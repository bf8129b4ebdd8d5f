#include "data/llmc_shard.h"

namespace zoe {

namespace {

int32_t le_i32(const uint8_t* p) {
  uint32_t v = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  return static_cast<int32_t>(v);
}

// The three header fields and the size they imply; returns ntok (possibly 0).
Result<uint64_t> check_header(const uint8_t* data, size_t size, const std::string& path) {
  if (size < kLlmcHeaderBytes)
    return Status::Invalid(path + ": " + std::to_string(size) +
                           " bytes, shorter than the 1024-byte llm.c shard header");
  const int32_t magic = le_i32(data), version = le_i32(data + 4), count = le_i32(data + 8);
  if (magic != kLlmcMagic)
    return Status::Invalid(path + ": bad llm.c shard magic " + std::to_string(magic) +
                           " (expected " + std::to_string(kLlmcMagic) + ")");
  if (version != kLlmcVersion)
    return Status::Invalid(path + ": unsupported llm.c shard version " + std::to_string(version) +
                           " (expected " + std::to_string(kLlmcVersion) + ")");
  if (count < 0)
    return Status::Invalid(path + ": negative token count " + std::to_string(count) + " in header");
  const uint64_t ntok = static_cast<uint64_t>(count);
  const uint64_t expect = kLlmcHeaderBytes + 2 * ntok;  // ntok < 2^31: no overflow
  if (size != expect)
    return Status::Invalid(path + ": file is " + std::to_string(size) + " bytes, expected " +
                           std::to_string(expect) + " (1024 + 2 * " + std::to_string(ntok) +
                           " tokens)" + (size < expect ? ": truncated" : ""));
  return ntok;
}

// Every token below vocab_size; a vocabulary of 65536 or more admits any uint16.
Status check_tokens(const uint8_t* tokens, uint64_t ntok, int64_t vocab_size, const std::string& path) {
  if (vocab_size >= 65536) return Status::Ok();
  for (uint64_t i = 0; i < ntok; ++i) {
    const uint16_t t = static_cast<uint16_t>(tokens[2 * i] | tokens[2 * i + 1] << 8);
    if (t >= vocab_size)
      return Status::Invalid(path + ": token " + std::to_string(t) + " at position " +
                             std::to_string(i) + " (byte offset " +
                             std::to_string(kLlmcHeaderBytes + 2 * i) +
                             ") is not below vocab_size " + std::to_string(vocab_size));
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> check_llmc_shard(const uint8_t* data, size_t size, int64_t vocab_size,
                                  const std::string& path) {
  if (vocab_size <= 0)
    return Status::Invalid("vocab_size must be positive, got " + std::to_string(vocab_size));
  ZOE_ASSIGN_OR_RETURN(uint64_t ntok, check_header(data, size, path));
  if (ntok == 0) return Status::Invalid(path + ": llm.c shard holds no tokens");
  ZOE_RETURN_IF_ERROR(check_tokens(data + kLlmcHeaderBytes, ntok, vocab_size, path));
  return ntok;
}

}  // namespace zoe

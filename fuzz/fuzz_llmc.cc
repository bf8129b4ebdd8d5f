// Fuzzes the llm.c token shard check (check_llmc_shard, src/data/llmc_shard.h) that TokenSource
// runs on every `zoe.data.*` shard with format llmc. Shards come from outside (llm.c's data
// scripts, downloads), so no input may crash or read out of bounds: a bad one is an Invalid
// Status. Run with GPT-2's vocabulary and with a byte-sized one so the token scan can fail too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "data/llmc_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (int64_t vocab : {int64_t{50257}, int64_t{256}}) {
    zoe::Result<uint64_t> n = zoe::check_llmc_shard(data, size, vocab, "fuzz.bin");
    if (n.ok() && zoe::kLlmcHeaderBytes + 2 * *n != size) std::abort();  // the check promised it
  }
  return 0;
}

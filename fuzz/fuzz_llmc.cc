// Fuzzes the data files' readers: the llm.c shard check (check_llmc_shard, src/data/llmc_shard.h)
// that TokenSource runs on every `zoe.data.*` shard with format llmc, and TokenSource itself on a
// file holding the input (both formats), including the file changing under it after Open: its
// second half rewritten with the input reversed, then the file cut in half. Data files come from
// outside (llm.c's data scripts, downloads, a user rewriting one mid-run), so no input may crash
// or read out of bounds, and every token TokenSource hands out must be below the vocabulary: a
// bad file is a Status. Run with GPT-2's vocabulary and with a byte-sized one so the scans fail too.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/llmc_shard.h"
#include "data/token_source.h"

namespace {

// Reads every token of every shard in pieces; aborts if one is handed out at or past the vocabulary.
void read_all(const zoe::TokenSource& s) {
  std::vector<int32_t> out(97);
  for (size_t i = 0; i < s.num_shards(); ++i)
    for (uint64_t pos = 0; pos < s.shard_tokens(i); pos += out.size()) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), s.shard_tokens(i) - pos));
      std::fill(out.begin(), out.end(), -1);
      if (!s.copy(i, pos, n, out.data()).ok()) return;  // the file changed: an error, as promised
      for (size_t k = 0; k < n; ++k)
        if (out[k] < 0 || out[k] >= s.vocab_size()) std::abort();
    }
}

void fuzz_token_source(const uint8_t* data, size_t size, zoe::TokenFormat format, int64_t vocab) {
  int fd = memfd_create("fuzz-tokens", MFD_CLOEXEC);
  if (fd < 0) return;
  if (size == 0 || pwrite(fd, data, size, 0) == static_cast<ssize_t>(size)) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    zoe::Result<zoe::TokenSource> s = zoe::TokenSource::Open(format, path, vocab);
    if (s.ok()) {
      read_all(*s);
      std::vector<uint8_t> reversed(data + size / 2, data + size);
      std::reverse(reversed.begin(), reversed.end());
      if (pwrite(fd, reversed.data(), reversed.size(), size / 2) == static_cast<ssize_t>(reversed.size())) read_all(*s);
      if (ftruncate(fd, static_cast<off_t>(size / 2)) == 0) read_all(*s);
    }
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (int64_t vocab : {int64_t{50257}, int64_t{256}}) {
    zoe::Result<uint64_t> n = zoe::check_llmc_shard(data, size, vocab, "fuzz.bin");
    if (n.ok() && zoe::kLlmcHeaderBytes + 2 * *n != size) std::abort();  // the check promised it
  }
  fuzz_token_source(data, size, zoe::TokenFormat::kLlmc, 50257);
  fuzz_token_source(data, size, zoe::TokenFormat::kLlmc, 300);
  fuzz_token_source(data, size, zoe::TokenFormat::kBytes, 100);
  return 0;
}

// Fuzzes the safetensors header check (parse_safetensors_header, src/ckpt/safetensors_header.h)
// that SafetensorsReader::Open runs on every `zoe.init` file before touching its tensors. Such a
// file comes from outside (a Hugging Face download), so no input may crash or read out of
// bounds: a bad one is a Corrupt Status. On success every tensor must lie inside the input, which
// this target checks by reading each tensor's last byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "ckpt/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zoe::StHeader h;
  zoe::Status s = zoe::parse_safetensors_header(data, size, "fuzz.safetensors", &h);
  if (!s.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const zoe::StTensorInfo& t : h.tensors) {
    if (h.data_offset + t.data_end > size) std::abort();  // the check promised otherwise
    if (t.nbytes() > 0) sink = sink ^ data[h.data_offset + t.data_end - 1];
  }
  return 0;
}

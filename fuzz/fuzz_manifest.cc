// Fuzzes the checkpoint manifest check (parse_manifest, src/ckpt/manifest.h): the manifest.json
// `zoe train` reads to resume and `zoe export` reads to consolidate. A checkpoint directory may
// be damaged or hand-edited, so no input may crash: a bad one is an error Status (exit 2).
// parse_manifest touches no file, so the directory named here need not exist.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ckpt/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)zoe::parse_manifest(text, "/nonexistent/step_00000001");
  return 0;
}

// Fuzzes the checkpoint manifest check (parse_manifest, src/ckpt/manifest.h): the manifest.json
// `zoe train` reads to resume and `zoe export` reads to consolidate. A checkpoint directory may
// be damaged or hand-edited, so no input may crash: a bad one is a Corrupt Status (exit 2).
// parse_manifest touches no file, so the directory named here need not exist. An accepted
// manifest must also survive being written and read back, as every checkpoint zoe saves is.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ckpt/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  zoe::Result<zoe::CheckpointManifest> m = zoe::parse_manifest(text, "/nonexistent/step_00000001");
  if (!m.ok()) return 0;
  if (!zoe::parse_manifest(zoe::manifest_to_text(*m), "again").ok()) std::abort();
  return 0;
}

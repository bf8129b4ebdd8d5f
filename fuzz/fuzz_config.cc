// Fuzzes the training configuration: parse_config (src/common/config.h) on arbitrary text, the
// contents of a --config file, and again with a --set override taken from the input. Both come
// from the user, so no input may crash, abort or hit undefined behaviour: a bad one is an Invalid
// Status (exit 2). An accepted config is also rendered to JSON, as `zoe train` does for every
// checkpoint manifest and report.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"

namespace {

void parse(const std::string& text, const std::vector<std::string>& overrides) {
  zoe::Result<zoe::Config> c = zoe::parse_config(text, overrides, "fuzz.json");
  if (c.ok()) (void)zoe::config_to_json(*c).dump();
}

}  // namespace

// Input: "<config text>\n<override>"; without a newline the whole input is the config text.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  parse(in, {});
  const size_t nl = in.find('\n');
  if (nl != std::string::npos) parse(in.substr(0, nl), {in.substr(nl + 1)});
  return 0;
}

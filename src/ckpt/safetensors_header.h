// Validates a whole safetensors file held in memory (format in ckpt/safetensors.h) and returns its
// tensor table. It is a function of bytes, not of a path, so that SafetensorsReader::Open (on the
// mapped file) and fuzz/fuzz_safetensors.cc (on fuzzer input) run exactly the same checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "zoe/status.h"

namespace zoe {

struct StHeader {
  std::vector<StTensorInfo> tensors;              // sorted by data_begin; they tile the buffer
  std::map<std::string, std::string> metadata;    // "__metadata__"
  uint64_t data_offset = 0;                       // start of the data buffer: 8 + header length
};

// data[0, size) is the whole file (data may be null when size is 0); `name` prefixes every
// message. Corrupt, naming the tensor, when the header length, the JSON, a dtype, a shape or the
// data offsets are wrong, or the tensors do not tile the data buffer exactly. On success every
// tensor's [data_offset + data_begin, data_offset + data_end) lies inside [0, size).
Status parse_safetensors_header(const uint8_t* data, size_t size, const std::string& name,
                                StHeader* out);

}  // namespace zoe

// Reads a safetensors file (format in ckpt/safetensors.h): memory-maps it and validates the whole
// header on Open() (parse_safetensors_header), so that every later access is in bounds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/safetensors.h"
#include "ckpt/safetensors_header.h"
#include "common/mapped_file.h"
#include "zoe/status.h"

namespace zoe {

class SafetensorsReader {
 public:
  // Invalid/Io when the file cannot be opened; Corrupt, naming the file and the tensor, when the
  // header length, the JSON, a dtype, a shape or the data offsets are wrong, or the tensors do
  // not tile the data buffer exactly.
  static Result<SafetensorsReader> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensorInfo* find(std::string_view name) const;  // null when absent

  // The tensor's bytes inside the mapping (unaligned, little-endian), valid while *this lives.
  const uint8_t* data(const StTensorInfo& t) const { return data_ + t.data_begin; }

  // Converts tensor `name` (F32, BF16 or F16) to fp32 into out[0, n). Invalid when the tensor is
  // absent or n != its numel; Unsupported for other dtypes.
  Status read_f32(std::string_view name, float* out, size_t n) const;
  Result<std::vector<float>> read_f32(std::string_view name) const;

 private:
  MappedFile file_;
  const uint8_t* data_ = nullptr;  // start of the data buffer
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace zoe

// The safetensors format (https://github.com/huggingface/safetensors), shared by its reader and
// writer:
//   8 bytes  little-endian uint64 N, the header length
//   N bytes  JSON: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//                   optional "__metadata__": {"<key>": "<string>", ...}}; may end in spaces
//   rest     the data buffer; offsets are relative to its start, and the tensors tile it exactly
//            (no gaps, no overlaps, nothing after the last tensor).
// Tensor data is row-major and little-endian; it need not be aligned.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zoe/dtype.h"

namespace zoe {

enum class StDType : uint8_t {
  kBool, kU8, kI8, kF8E4M3, kF8E5M2, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64
};

std::string_view st_dtype_name(StDType t);               // "F32", "BF16", ...
std::optional<StDType> st_dtype_from_name(std::string_view s);
size_t st_dtype_size(StDType t);                          // bytes per element
StDType st_dtype_of(DType t);                             // kF32 / kBF16 / kF16
std::optional<DType> dtype_of(StDType t);                 // empty for types zoe does not compute in

// One tensor's entry in a header. data_begin/data_end are relative to the data buffer.
struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
  uint64_t nbytes() const { return data_end - data_begin; }
};

// Header lengths above this are rejected as corrupt (the reference implementation's limit).
inline constexpr uint64_t kStMaxHeaderBytes = 100'000'000;

}  // namespace zoe

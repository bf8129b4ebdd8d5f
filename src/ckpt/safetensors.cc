#include "ckpt/safetensors.h"

#include <array>

namespace zoe {

namespace {

struct DTypeRow {
  StDType t;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeRow, 15> kDTypes = {{
    {StDType::kBool, "BOOL", 1}, {StDType::kU8, "U8", 1},     {StDType::kI8, "I8", 1},
    {StDType::kF8E4M3, "F8_E4M3", 1}, {StDType::kF8E5M2, "F8_E5M2", 1},
    {StDType::kI16, "I16", 2},   {StDType::kU16, "U16", 2},   {StDType::kF16, "F16", 2},
    {StDType::kBF16, "BF16", 2}, {StDType::kI32, "I32", 4},   {StDType::kU32, "U32", 4},
    {StDType::kF32, "F32", 4},   {StDType::kF64, "F64", 8},   {StDType::kI64, "I64", 8},
    {StDType::kU64, "U64", 8},
}};

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (static_cast<size_t>(kDTypes[i].t) != i) return false;
  return true;
}
static_assert(rows_in_enum_order());

const DTypeRow& row(StDType t) { return kDTypes[static_cast<size_t>(t)]; }

}  // namespace

std::string_view st_dtype_name(StDType t) { return row(t).name; }

std::optional<StDType> st_dtype_from_name(std::string_view s) {
  for (const auto& r : kDTypes)
    if (r.name == s) return r.t;
  return std::nullopt;
}

size_t st_dtype_size(StDType t) { return row(t).size; }

StDType st_dtype_of(DType t) {
  switch (t) {
    case DType::kF32: return StDType::kF32;
    case DType::kBF16: return StDType::kBF16;
    default: return StDType::kF16;
  }
}

std::optional<DType> dtype_of(StDType t) {
  switch (t) {
    case StDType::kF32: return DType::kF32;
    case StDType::kBF16: return DType::kBF16;
    case StDType::kF16: return DType::kF16;
    default: return std::nullopt;
  }
}

}  // namespace zoe

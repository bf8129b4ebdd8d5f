#include "ckpt/safetensors_reader.h"

#include <cstring>

namespace zoe {

Result<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader r;
  ZOE_ASSIGN_OR_RETURN(r.file_, MappedFile::Open(path));
  StHeader h;
  ZOE_RETURN_IF_ERROR(parse_safetensors_header(r.file_.data(), r.file_.size(), path, &h));
  r.tensors_ = std::move(h.tensors);
  r.metadata_ = std::move(h.metadata);
  for (size_t i = 0; i < r.tensors_.size(); ++i) r.index_.emplace(r.tensors_[i].name, i);
  r.data_ = r.file_.data() + h.data_offset;
  return r;
}

const StTensorInfo* SafetensorsReader::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsReader::read_f32(std::string_view name, float* out, size_t n) const {
  const StTensorInfo* t = find(name);
  if (!t) return Status::Invalid(path() + ": no tensor '" + std::string(name) + "'");
  if (n != t->numel)
    return Status::Invalid(path() + ": tensor '" + t->name + "' has " + std::to_string(t->numel) +
                           " elements, caller expected " + std::to_string(n));
  const uint8_t* src = data(*t);
  switch (t->dtype) {
    case StDType::kF32:
      if (n) std::memcpy(out, src, n * 4);
      return Status::Ok();
    case StDType::kBF16:
    case StDType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = t->dtype == StDType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return Status::Ok();
    default:
      return Status::Unsupported(path() + ": tensor '" + t->name + "' has dtype " +
                                 std::string(st_dtype_name(t->dtype)) +
                                 "; only F32, BF16 and F16 convert to fp32");
  }
}

Result<std::vector<float>> SafetensorsReader::read_f32(std::string_view name) const {
  const StTensorInfo* t = find(name);
  if (!t) return Status::Invalid(path() + ": no tensor '" + std::string(name) + "'");
  std::vector<float> v(t->numel);
  ZOE_RETURN_IF_ERROR(read_f32(name, v.data(), v.size()));
  return v;
}

}  // namespace zoe

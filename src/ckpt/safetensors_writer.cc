#include "ckpt/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "ckpt/atomic_file.h"

namespace zoe {

Status SafetensorsWriter::add(std::string name, StDType dtype, std::vector<int64_t> shape,
                              const void* data) {
  return add_entry(std::move(name), dtype, std::move(shape), data, nullptr);
}

Status SafetensorsWriter::add_streamed(std::string name, DType dtype, std::vector<int64_t> shape, Fill fill) {
  if (!fill) return Status::Invalid("safetensors: tensor '" + name + "' has no fill function");
  return add_entry(std::move(name), st_dtype_of(dtype), std::move(shape), nullptr, std::move(fill));
}

Status SafetensorsWriter::add_entry(std::string name, StDType dtype, std::vector<int64_t> shape,
                                    const void* data, Fill fill) {
  if (name.empty()) return Status::Invalid("safetensors: empty tensor name");
  if (name == "__metadata__") return Status::Invalid("safetensors: '__metadata__' is reserved");
  if (names_.count(name)) return Status::Invalid("safetensors: tensor '" + name + "' added twice");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return Status::Invalid("safetensors: tensor '" + name + "' has negative dim " + std::to_string(d));
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
      return Status::Invalid("safetensors: tensor '" + name + "' shape overflows 64 bits");
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, st_dtype_size(dtype), &nbytes))
    return Status::Invalid("safetensors: tensor '" + name + "' size overflows 64 bits");
  if (nbytes > 0 && data == nullptr && !fill)
    return Status::Invalid("safetensors: tensor '" + name + "' has no data");
  Entry e{StTensorInfo{std::move(name), dtype, std::move(shape), numel, buffer_bytes_,
                       buffer_bytes_ + nbytes},
          data, std::move(fill)};
  buffer_bytes_ += nbytes;
  names_.insert(e.info.name);
  tensors_.push_back(std::move(e));
  return Status::Ok();
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  for (auto& kv : metadata_)
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  metadata_.emplace_back(std::move(key), std::move(value));
}

Status SafetensorsWriter::write(const std::string& path, std::string* checksum) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  for (const Entry& e : tensors_) {
    h[e.info.name] = {{"dtype", std::string(st_dtype_name(e.info.dtype))},
                      {"shape", e.info.shape},
                      {"data_offsets", {e.info.data_begin, e.info.data_end}}};
  }
  std::string header;
  try {
    header = h.dump();
  } catch (const nlohmann::json::exception& ex) {  // invalid UTF-8 in a name
    return Status::Invalid(path + ": cannot encode safetensors header: " + ex.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));

  ZOE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
  ZOE_RETURN_IF_ERROR(f.append(len, 8));
  ZOE_RETURN_IF_ERROR(f.append(header));
  for (const Entry& e : tensors_) {
    if (!e.fill) {
      ZOE_RETURN_IF_ERROR(f.append(e.data, e.info.nbytes()));
      continue;
    }
    uint64_t before = f.bytes_written();
    ZOE_RETURN_IF_ERROR(e.fill(f));
    if (f.bytes_written() - before != e.info.nbytes())
      return Status::Runtime(path + ": tensor '" + e.info.name + "' was filled with " +
                             std::to_string(f.bytes_written() - before) + " bytes, not " +
                             std::to_string(e.info.nbytes()));
  }
  ZOE_RETURN_IF_ERROR(f.commit());
  if (checksum) *checksum = f.checksum_hex();
  return Status::Ok();
}

}  // namespace zoe

#include "ckpt/params_from_file.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckpt/safetensors_reader.h"

namespace zoe {

Status init_params_from_file(Engine& e, const std::string& path, const std::string& alt_prefix,
                             const std::string& what) {
  auto file = SafetensorsReader::Open(path);
  if (!file.ok()) return Status::Invalid(fmt::format("{}: {}", what, file.status().message()));
  std::vector<float> buf;
  for (int u = 0; u < e.num_units(); ++u) {
    buf.resize(e.unit(u).numel);
    for (const zoe::TensorSpec& t : e.unit(u).tensors) {  // not gpt2's (a unity batch sees its using-directive)
      const StTensorInfo* info = file->find(t.name);
      if (!info && !alt_prefix.empty()) info = file->find(alt_prefix + t.name);
      if (!info) return Status::Invalid(fmt::format("{} '{}': tensor '{}' is missing", what, path, t.name));
      if (info->shape != t.shape)
        return Status::Invalid(fmt::format("{} '{}': tensor '{}' has shape [{}], the model needs [{}]", what, path,
                                           t.name, fmt::join(info->shape, ", "), fmt::join(t.shape, ", ")));
      Status st = file->read_f32(info->name, buf.data() + t.offset, t.numel);
      if (!st.ok()) return Status::Invalid(fmt::format("{}: {}", what, st.message()));
    }
    ZOE_RETURN_IF_ERROR(e.set_params(u, buf.data()));
  }
  return Status::Ok();
}

}  // namespace zoe

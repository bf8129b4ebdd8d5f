#include "ckpt/safetensors_reader.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

namespace zoe {

namespace {

using nlohmann::json;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Parses one tensor entry; `where` is "<file>: tensor '<name>'".
Status parse_entry(const std::string& where, const json& e, StTensorInfo* t) {
  if (!e.is_object()) return Status::Corrupt(where + ": entry is not a JSON object");
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) return Status::Corrupt(where + ": missing string 'dtype'");
  std::optional<StDType> d = st_dtype_from_name(dt->get_ref<const std::string&>());
  if (!d) return Status::Corrupt(where + ": unknown dtype '" + dt->get<std::string>() + "'");
  t->dtype = *d;

  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) return Status::Corrupt(where + ": missing array 'shape'");
  t->shape.clear();
  uint64_t numel = 1;
  for (const json& dim : *sh) {
    if (!dim.is_number_unsigned())
      return Status::Corrupt(where + ": shape " + sh->dump() + " holds a non-integer or negative dim");
    uint64_t v = dim.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, v, &numel))
      return Status::Corrupt(where + ": shape " + sh->dump() + " overflows 64 bits");
    t->shape.push_back(static_cast<int64_t>(v));
  }
  t->numel = numel;

  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return Status::Corrupt(where + ": 'data_offsets' must be [begin, end], two non-negative integers");
  t->data_begin = (*off)[0].get<uint64_t>();
  t->data_end = (*off)[1].get<uint64_t>();
  if (t->data_end < t->data_begin)
    return Status::Corrupt(where + ": data_offsets [" + std::to_string(t->data_begin) + ", " +
                           std::to_string(t->data_end) + "] end before they begin");
  uint64_t need;
  if (__builtin_mul_overflow(numel, st_dtype_size(t->dtype), &need))
    return Status::Corrupt(where + ": shape " + shape_string(t->shape) + " overflows 64 bits");
  if (t->nbytes() != need)
    return Status::Corrupt(where + ": data_offsets [" + std::to_string(t->data_begin) + ", " +
                           std::to_string(t->data_end) + "] span " + std::to_string(t->nbytes()) +
                           " bytes, but shape " + shape_string(t->shape) + " of " +
                           std::string(st_dtype_name(t->dtype)) + " needs " + std::to_string(need));
  return Status::Ok();
}

}  // namespace

Result<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader r;
  ZOE_ASSIGN_OR_RETURN(r.file_, MappedFile::Open(path));
  const uint8_t* p = r.file_.data();
  const uint64_t size = r.file_.size();
  if (size < 8)
    return Status::Corrupt(path + ": not a safetensors file: " + std::to_string(size) +
                           " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  if (n > kStMaxHeaderBytes || n > size - 8)
    return Status::Corrupt(path + ": header length " + std::to_string(n) + " is impossible for a " +
                           std::to_string(size) + "-byte file" +
                           (n > kStMaxHeaderBytes ? " (limit 100000000)" : ""));
  const char* hb = reinterpret_cast<const char*>(p + 8);
  if (n == 0 || hb[0] != '{')
    return Status::Corrupt(path + ": header does not start with '{' (not a safetensors file?)");

  // Duplicate top-level keys would silently replace one another in the parsed object.
  std::string duplicate;
  std::set<std::string> seen;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(hb, hb + n, cb);
  } catch (const json::exception& e) {
    return Status::Corrupt(path + ": header is not valid JSON: " + e.what());
  }
  if (!duplicate.empty())
    return Status::Corrupt(path + ": tensor '" + duplicate + "' appears twice in the header");
  if (!h.is_object()) return Status::Corrupt(path + ": header is not a JSON object");

  const uint64_t buf_size = size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Status::Corrupt(path + ": __metadata__ is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return Status::Corrupt(path + ": __metadata__ value of '" + m.key() + "' is not a string");
        r.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    StTensorInfo t;
    t.name = it.key();
    std::string where = path + ": tensor '" + t.name + "'";
    ZOE_RETURN_IF_ERROR(parse_entry(where, *it, &t));
    if (t.data_end > buf_size)
      return Status::Corrupt(where + ": data_offsets end " + std::to_string(t.data_end) +
                             " is past the end of the " + std::to_string(buf_size) +
                             "-byte data buffer (file truncated?)");
    r.tensors_.push_back(std::move(t));
  }

  std::stable_sort(r.tensors_.begin(), r.tensors_.end(),
                   [](const StTensorInfo& a, const StTensorInfo& b) {
                     return a.data_begin != b.data_begin ? a.data_begin < b.data_begin
                                                         : a.data_end < b.data_end;
                   });
  uint64_t covered = 0;
  for (size_t i = 0; i < r.tensors_.size(); ++i) {
    const StTensorInfo& t = r.tensors_[i];
    if (t.data_begin < covered)
      return Status::Corrupt(path + ": tensor '" + t.name + "' [" + std::to_string(t.data_begin) +
                             ", " + std::to_string(t.data_end) + ") overlaps tensor '" +
                             r.tensors_[i - 1].name + "' which ends at " + std::to_string(covered));
    if (t.data_begin > covered)
      return Status::Corrupt(path + ": gap of " + std::to_string(t.data_begin - covered) +
                             " bytes in the data buffer before tensor '" + t.name + "'");
    covered = t.data_end;
  }
  if (covered != buf_size)
    return Status::Corrupt(path + ": " + std::to_string(buf_size - covered) +
                           " bytes at the end of the data buffer belong to no tensor");

  for (size_t i = 0; i < r.tensors_.size(); ++i) r.index_.emplace(r.tensors_[i].name, i);
  r.data_ = p + 8 + n;
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

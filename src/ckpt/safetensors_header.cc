#include "ckpt/safetensors_header.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"

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

// The 8-byte little-endian header length, checked against the file size and the limit.
Status read_header_length(const uint8_t* p, uint64_t size, const std::string& path, uint64_t* n) {
  if (size < 8)
    return Status::Corrupt(path + ": not a safetensors file: " + std::to_string(size) +
                           " bytes, too short for the 8-byte header length");
  *n = 0;
  for (int i = 7; i >= 0; --i) *n = (*n << 8) | p[i];
  if (*n > kStMaxHeaderBytes || *n > size - 8)
    return Status::Corrupt(path + ": header length " + std::to_string(*n) + " is impossible for a " +
                           std::to_string(size) + "-byte file" +
                           (*n > kStMaxHeaderBytes ? " (limit 100000000)" : ""));
  if (*n == 0 || p[8] != '{')
    return Status::Corrupt(path + ": header does not start with '{' (not a safetensors file?)");
  return Status::Ok();
}

// Parses the header JSON, rejecting duplicate top-level keys: they would silently replace one
// another in the parsed object.
Status parse_json(const char* begin, const char* end, const std::string& path, json* h) {
  std::string duplicate;
  std::set<std::string> seen;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  try {
    *h = json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    return Status::Corrupt(path + ": header is not valid JSON: " + e.what());
  }
  if (!duplicate.empty())
    return Status::Corrupt(path + ": tensor '" + duplicate + "' appears twice in the header");
  if (!h->is_object()) return Status::Corrupt(path + ": header is not a JSON object");
  if (json_deeper_than(*h, kMaxJsonDepth))  // error messages dump() parts of it, recursively
    return Status::Corrupt(path + ": header nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  return Status::Ok();
}

Status parse_metadata(const json& m, const std::string& path, std::map<std::string, std::string>* out) {
  if (!m.is_object()) return Status::Corrupt(path + ": __metadata__ is not a JSON object");
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it->is_string())
      return Status::Corrupt(path + ": __metadata__ value of '" + it.key() + "' is not a string");
    (*out)[it.key()] = it->get<std::string>();
  }
  return Status::Ok();
}

// Sorts the tensors by offset and checks they tile [0, buf_size) with no gap and no overlap.
Status check_tiling(std::vector<StTensorInfo>* tensors, uint64_t buf_size, const std::string& path) {
  std::stable_sort(tensors->begin(), tensors->end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const StTensorInfo& t = (*tensors)[i];
    if (t.data_begin < covered)
      return Status::Corrupt(path + ": tensor '" + t.name + "' [" + std::to_string(t.data_begin) +
                             ", " + std::to_string(t.data_end) + ") overlaps tensor '" +
                             (*tensors)[i - 1].name + "' which ends at " + std::to_string(covered));
    if (t.data_begin > covered)
      return Status::Corrupt(path + ": gap of " + std::to_string(t.data_begin - covered) +
                             " bytes in the data buffer before tensor '" + t.name + "'");
    covered = t.data_end;
  }
  if (covered != buf_size)
    return Status::Corrupt(path + ": " + std::to_string(buf_size - covered) +
                           " bytes at the end of the data buffer belong to no tensor");
  return Status::Ok();
}

}  // namespace

Status parse_safetensors_header(const uint8_t* p, size_t size, const std::string& path,
                                StHeader* out) {
  uint64_t n = 0;
  ZOE_RETURN_IF_ERROR(read_header_length(p, size, path, &n));
  json h;
  const char* hb = reinterpret_cast<const char*>(p + 8);
  ZOE_RETURN_IF_ERROR(parse_json(hb, hb + n, path, &h));

  StHeader r;
  const uint64_t buf_size = size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      ZOE_RETURN_IF_ERROR(parse_metadata(*it, path, &r.metadata));
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
    r.tensors.push_back(std::move(t));
  }
  ZOE_RETURN_IF_ERROR(check_tiling(&r.tensors, buf_size, path));
  r.data_offset = 8 + n;
  *out = std::move(r);
  return Status::Ok();
}

}  // namespace zoe

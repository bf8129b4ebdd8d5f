#include "ckpt/manifest.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "common/json_depth.h"

namespace zoe {
namespace {

using json = nlohmann::json;

// Bounds that no real checkpoint reaches but that keep every product and sum below 2^63.
constexpr int64_t kMaxCount = int64_t{1} << 40;  // steps, elements, positions
constexpr int kMaxWorld = 1 << 20;

// Typed access to one JSON object's fields; every error names the field by its full path.
class Fields {
 public:
  Fields(const std::string& dir, const json& obj, std::string path) : dir_(dir), obj_(obj), path_(std::move(path)) {}

  Status bad(const std::string& key, const std::string& expected) const {
    auto it = obj_.find(key);
    std::string got = it == obj_.end() ? "nothing (missing)" : it->dump();
    if (got.size() > 80) got = got.substr(0, 77) + "...";
    return Status::Corrupt(fmt::format("checkpoint '{}': {} field '{}': expected {}, got {}", dir_, kManifestName,
                                       name(key), expected, got));
  }
  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  Status integer(const std::string& key, int64_t lo, int64_t hi, int64_t* out) const {
    const json* v = find(key);
    // Unsigned JSON integers above INT64_MAX must not wrap into range.
    bool in_range = v && v->is_number_integer() &&
                    (v->is_number_unsigned() ? v->get<uint64_t>() <= static_cast<uint64_t>(hi) : v->get<int64_t>() <= hi) &&
                    (v->is_number_unsigned() ? lo <= 0 || v->get<uint64_t>() >= static_cast<uint64_t>(lo)
                                             : v->get<int64_t>() >= lo);
    if (!in_range) return bad(key, fmt::format("an integer in [{}, {}]", lo, hi));
    *out = v->get<int64_t>();
    return Status::Ok();
  }
  Status string(const std::string& key, std::string* out) const {
    const json* v = find(key);
    if (!v || !v->is_string() || v->get_ref<const std::string&>().empty()) return bad(key, "a non-empty string");
    *out = v->get<std::string>();
    return Status::Ok();
  }
  Status array(const std::string& key, const json** out) const {
    const json* v = find(key);
    if (!v || !v->is_array()) return bad(key, "an array");
    *out = v;
    return Status::Ok();
  }
  Status object(const std::string& key, const json** out) const {
    const json* v = find(key);
    if (!v || !v->is_object()) return bad(key, "an object");
    *out = v;
    return Status::Ok();
  }
  Status number(const std::string& key, double lo_exclusive, double* out) const {
    const json* v = find(key);
    if (!v || !v->is_number() || !std::isfinite(v->get<double>()) || !(v->get<double>() > lo_exclusive))
      return bad(key, fmt::format("a finite number > {}", lo_exclusive));
    *out = v->get<double>();
    return Status::Ok();
  }

 private:
  const std::string& dir_;
  const json& obj_;
  std::string path_;
};

Status corrupt(const std::string& dir, const std::string& what) {
  return Status::Corrupt(fmt::format("checkpoint '{}': {} {}", dir, kManifestName, what));
}

Status parse_tensor(const std::string& dir, const json& t, const std::string& path, int64_t unit_numel,
                    ManifestTensor* out) {
  if (!t.is_object()) return corrupt(dir, fmt::format("field '{}': expected an object", path));
  Fields f(dir, t, path);
  ZOE_RETURN_IF_ERROR(f.string("name", &out->name));
  const json* shape = nullptr;
  ZOE_RETURN_IF_ERROR(f.array("shape", &shape));
  if (shape->size() > 8) return f.bad("shape", "at most 8 dimensions");
  int64_t numel = 1;
  for (const json& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxCount ||
        (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(kMaxCount)))
      return f.bad("shape", fmt::format("dimensions in [0, {}]", kMaxCount));
    if (__builtin_mul_overflow(numel, d.get<int64_t>(), &numel) || numel > kMaxCount)
      return f.bad("shape", fmt::format("at most {} elements", kMaxCount));
    out->shape.push_back(d.get<int64_t>());
  }
  out->numel = numel;
  ZOE_RETURN_IF_ERROR(f.integer("offset", 0, unit_numel, &out->offset));
  if (out->offset + numel > unit_numel)
    return f.bad("offset", fmt::format("offset + {} elements within the unit's {} elements", numel, unit_numel));
  return Status::Ok();
}

// Two tensors sharing elements would alias each other on export and resume: whatever the format
// version (a checksum is no signature), every unit's tensors must be disjoint.
Status check_no_overlap(const std::string& dir, const std::string& path, const ManifestUnit& unit) {
  std::vector<size_t> order;
  for (size_t t = 0; t < unit.tensors.size(); ++t)
    if (unit.tensors[t].numel > 0) order.push_back(t);  // an empty tensor holds no element
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return unit.tensors[a].offset < unit.tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const ManifestTensor &prev = unit.tensors[order[i - 1]], &cur = unit.tensors[order[i]];
    if (cur.offset < prev.offset + prev.numel)
      return corrupt(dir, fmt::format("field '{}.tensors[{}].offset': tensor '{}' at [{}, {}) overlaps tensor '{}' "
                                      "at [{}, {}) in unit '{}'", path, order[i], cur.name, cur.offset,
                                      cur.offset + cur.numel, prev.name, prev.offset, prev.offset + prev.numel,
                                      unit.name));
  }
  return Status::Ok();
}

Status parse_units(const std::string& dir, const json& units, std::vector<ManifestUnit>* out) {
  if (units.empty()) return corrupt(dir, "field 'units': expected at least one unit");
  std::set<std::string> names;
  for (size_t u = 0; u < units.size(); ++u) {
    std::string path = fmt::format("units[{}]", u);
    if (!units[u].is_object()) return corrupt(dir, fmt::format("field '{}': expected an object", path));
    Fields f(dir, units[u], path);
    ManifestUnit unit;
    ZOE_RETURN_IF_ERROR(f.string("name", &unit.name));
    ZOE_RETURN_IF_ERROR(f.integer("numel", 1, kMaxCount, &unit.numel));
    const json* tensors = nullptr;
    ZOE_RETURN_IF_ERROR(f.array("tensors", &tensors));
    for (size_t t = 0; t < tensors->size(); ++t) {
      ManifestTensor mt;
      std::string tpath = fmt::format("{}.tensors[{}]", path, t);
      ZOE_RETURN_IF_ERROR(parse_tensor(dir, (*tensors)[t], tpath, unit.numel, &mt));
      if (!names.insert(mt.name).second)
        return corrupt(dir, fmt::format("field '{}.name': tensor name '{}' appears twice", tpath, mt.name));
      unit.tensors.push_back(std::move(mt));
    }
    ZOE_RETURN_IF_ERROR(check_no_overlap(dir, path, unit));
    out->push_back(std::move(unit));
  }
  return Status::Ok();
}

Status parse_files(const std::string& dir, const json& files, CheckpointManifest* m) {
  if (files.size() != static_cast<size_t>(m->world_size))
    return corrupt(dir, fmt::format("field 'files': {} files listed for world size {}", files.size(), m->world_size));
  std::vector<uint64_t> sizes = manifest_file_bytes(m->units, m->world_size);
  for (int r = 0; r < m->world_size; ++r) {
    std::string path = fmt::format("files[{}]", r);
    if (!files[r].is_object()) return corrupt(dir, fmt::format("field '{}': expected an object", path));
    Fields f(dir, files[r], path);
    ManifestFile file;
    // Only the one expected plain name: never a path that leaves the directory.
    ZOE_RETURN_IF_ERROR(f.string("name", &file.name));
    // (fmt, not "\"" + std::string: gcc 12 warns falsely about that operator+, -Wrestrict)
    if (file.name != manifest_rank_file_name(r))
      return f.bad("name", fmt::format("\"{}\"", manifest_rank_file_name(r)));
    int64_t bytes = 0;
    uint64_t want = sizes[r];
    ZOE_RETURN_IF_ERROR(f.integer("bytes", 0, std::numeric_limits<int64_t>::max(), &bytes));
    if (static_cast<uint64_t>(bytes) != want)
      return f.bad("bytes", fmt::format("{} (3 fp32 states of the elements rank {} owns)", want, r));
    file.bytes = want;
    ZOE_RETURN_IF_ERROR(f.string("xxh3", &file.xxh3));
    if (file.xxh3.size() != 16 || file.xxh3.find_first_not_of("0123456789abcdef") != std::string::npos)
      return f.bad("xxh3", "16 lower-case hex digits");
    m->files.push_back(std::move(file));
  }
  return Status::Ok();
}

Status parse_train_state(const std::string& dir, const json& root, CheckpointManifest* m) {
  Fields top(dir, root, "");
  TrainState& st = m->train_state;
  ZOE_RETURN_IF_ERROR(top.integer("step", 0, kMaxCount, &st.steps_done));
  ZOE_RETURN_IF_ERROR(top.integer("steps_applied", 0, st.steps_done, &st.steps_applied));
  const json* ts = nullptr;
  ZOE_RETURN_IF_ERROR(top.object("train_state", &ts));
  Fields f(dir, *ts, "train_state");
  ZOE_RETURN_IF_ERROR(f.number("loss_scale", 0.0, &st.loss_scale));
  ZOE_RETURN_IF_ERROR(f.integer("scaler_good_steps", 0, kMaxCount, &st.scaler_good_steps));
  int64_t hyst = 0, shard = 0;
  ZOE_RETURN_IF_ERROR(f.integer("scaler_hysteresis", 0, 1 << 30, &hyst));
  st.scaler_hysteresis = static_cast<int>(hyst);
  // A position is a sample or token index and a shard an index into the data's files: both far
  // below 2^40, and a source adding a round's samples to a larger one would overflow.
  ZOE_RETURN_IF_ERROR(f.integer("data_position", 0, kMaxCount, &st.data_position));
  ZOE_RETURN_IF_ERROR(f.integer("data_shard", 0, kMaxCount, &shard));
  st.data_shard = static_cast<uint64_t>(shard);
  // A diverged run's last loss is NaN, which JSON stores as null.
  const json* loss = f.find("last_loss");
  if (!loss || !(loss->is_null() || loss->is_number())) return f.bad("last_loss", "a number or null");
  st.last_loss = loss->is_null() ? std::nan("") : loss->get<double>();
  return Status::Ok();
}

}  // namespace

int64_t manifest_chunk(int64_t numel, int world) { return (numel + world - 1) / world; }

int64_t manifest_owned(int64_t numel, int world, int rank) {
  int64_t c = manifest_chunk(numel, world);
  return std::clamp<int64_t>(numel - rank * c, 0, c);
}

std::vector<uint64_t> manifest_file_bytes(const std::vector<ManifestUnit>& units, int world) {
  // One pass over the units: a unit gives full chunks to ranks [0, full) and the remainder to rank
  // `full`, so a difference array adds each unit's chunks to a range of ranks at once (a hostile
  // manifest with many units and ranks costs units + ranks, not units x ranks).
  std::vector<uint64_t> diff(world + 1, 0), tail(world, 0);
  for (const ManifestUnit& u : units) {
    int64_t c = manifest_chunk(u.numel, world), full = u.numel / c, rem = u.numel - full * c;
    diff[0] += c;
    diff[full] -= c;
    if (rem > 0) tail[full] += rem;
  }
  std::vector<uint64_t> bytes(world);
  uint64_t run = 0;
  for (int r = 0; r < world; ++r) {
    run += diff[r];
    bytes[r] = 4 * 3 * (run + tail[r]);
  }
  return bytes;
}

std::string manifest_rank_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

Result<CheckpointManifest> parse_manifest(std::string_view text, const std::string& dir) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return corrupt(dir, "is not a valid JSON object");
  // Copying the config and dump() recurse once per level: a deep one would overflow the stack.
  if (json_deeper_than(root, kMaxJsonDepth))
    return corrupt(dir, fmt::format("nests deeper than {} levels", kMaxJsonDepth));
  Fields f(dir, root, "");
  CheckpointManifest m;
  std::string format;
  ZOE_RETURN_IF_ERROR(f.string("format", &format));
  if (format != "zoe-checkpoint") return f.bad("format", "\"zoe-checkpoint\"");
  int64_t v = 0;
  ZOE_RETURN_IF_ERROR(f.integer("format_version", 1, kCheckpointFormat, &v));
  m.format_version = static_cast<int>(v);
  ZOE_RETURN_IF_ERROR(f.integer("world_size", 1, kMaxWorld, &v));
  m.world_size = static_cast<int>(v);
  ZOE_RETURN_IF_ERROR(f.integer("stage", 0, 3, &v));
  m.stage = static_cast<int>(v);
  const json* obj = nullptr;
  ZOE_RETURN_IF_ERROR(f.object("config", &obj));
  m.config = *obj;
  ZOE_RETURN_IF_ERROR(f.array("units", &obj));
  ZOE_RETURN_IF_ERROR(parse_units(dir, *obj, &m.units));
  ZOE_RETURN_IF_ERROR(f.array("files", &obj));
  ZOE_RETURN_IF_ERROR(parse_files(dir, *obj, &m));
  ZOE_RETURN_IF_ERROR(parse_train_state(dir, root, &m));
  return m;
}

std::string manifest_to_text(const CheckpointManifest& m) {
  json units = json::array(), files = json::array();
  for (const ManifestUnit& u : m.units) {
    json t = json::array();
    for (const ManifestTensor& s : u.tensors) t.push_back({{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}});
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"tensors", t}});
  }
  for (const ManifestFile& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", f.xxh3}});
  const TrainState& st = m.train_state;
  json j = {{"format", "zoe-checkpoint"}, {"format_version", m.format_version}, {"step", st.steps_done},
            {"steps_applied", st.steps_applied}, {"world_size", m.world_size}, {"stage", m.stage},
            {"config", m.config}, {"units", units}, {"files", files},
            {"train_state", {{"loss_scale", st.loss_scale}, {"scaler_good_steps", st.scaler_good_steps},
                             {"scaler_hysteresis", st.scaler_hysteresis}, {"data_position", st.data_position},
                             {"data_shard", st.data_shard}, {"last_loss", st.last_loss}}}};
  return j.dump(2) + "\n";
}

}  // namespace zoe

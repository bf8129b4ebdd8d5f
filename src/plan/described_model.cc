#include "plan/described_model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/read_at_most.h"

namespace zoe {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "zoe model work 1";  // python/zoe/describe.py's FORMAT
constexpr size_t kMostUnits = 1 << 20;
constexpr size_t kMostFetches = 1 << 21;

Status bad(const std::string& origin, const std::string& what) {
  return Status::Invalid(fmt::format("model description {}: {}", origin, what));
}

// A whole number in [lo, hi], or an error naming `what`.
Result<int64_t> whole(const json& v, int64_t lo, int64_t hi, const std::string& origin, const std::string& what) {
  if (!v.is_number_integer()) return bad(origin, fmt::format("{} must be a whole number", what));
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) return bad(origin, fmt::format("{} is {}; it must lie in [{}, {}]", what, x, lo, hi));
  return x;
}

Result<DescribedStep> parse_step(const json& s, size_t i, size_t units, const std::string& origin) {
  const std::string at = fmt::format("micro_steps[{}]", i);
  if (!s.is_object()) return bad(origin, at + " must be an object");
  for (const char* key : {"micro_batch", "checkpointing", "tokens", "activation_bytes", "fetches"})
    if (!s.contains(key)) return bad(origin, fmt::format("{} has no \"{}\"", at, key));
  DescribedStep d;
  ZOE_ASSIGN_OR_RETURN(int64_t b, whole(s["micro_batch"], 1, 1 << 20, origin, at + ".micro_batch"));
  d.micro_batch = static_cast<int>(b);
  if (!s["checkpointing"].is_boolean()) return bad(origin, at + ".checkpointing must be true or false");
  d.checkpointing = s["checkpointing"].get<bool>();
  ZOE_ASSIGN_OR_RETURN(d.work.tokens, whole(s["tokens"], 1, int64_t{1} << 40, origin, at + ".tokens"));
  ZOE_ASSIGN_OR_RETURN(int64_t act, whole(s["activation_bytes"], 0, int64_t{1} << 50, origin, at + ".activation_bytes"));
  d.work.activation_bytes = uint64_t(act);
  const json& f = s["fetches"];
  if (!f.is_array() || f.empty() || f.size() > kMostFetches)
    return bad(origin, fmt::format("{}.fetches must be a list of 1 to {} [unit, seconds, backward]", at, kMostFetches));
  for (size_t k = 0; k < f.size(); ++k) {
    const std::string fat = fmt::format("{}.fetches[{}]", at, k);
    if (!f[k].is_array() || f[k].size() != 3) return bad(origin, fat + " must be [unit, seconds, backward]");
    ZOE_ASSIGN_OR_RETURN(int64_t u, whole(f[k][0], 0, int64_t(units) - 1, origin, fat + "'s unit"));
    if (!f[k][1].is_number() || !std::isfinite(f[k][1].get<double>()) || f[k][1].get<double>() < 0 ||
        f[k][1].get<double>() > 1e6)
      return bad(origin, fat + "'s seconds must be a finite number in [0, 1e6]");
    if (!f[k][2].is_boolean()) return bad(origin, fat + "'s backward must be true or false");
    d.work.fetches.push_back({static_cast<int>(u), f[k][1].get<double>(), f[k][2].get<bool>()});
  }
  return d;
}

}  // namespace

int64_t DescribedModel::total_elems() const {
  int64_t n = 0;
  for (int64_t e : unit_elems) n += e;
  return n;
}

Result<MicroStepWork> DescribedModel::step(int micro_batch, bool checkpointing) const {
  for (const DescribedStep& s : steps)
    if (s.micro_batch == micro_batch && s.checkpointing == checkpointing) return s.work;
  return Status::Invalid(fmt::format("the model description has no micro-step at micro-batch {}{}", micro_batch,
                                      checkpointing ? " checkpointed" : ""));
}

Result<DescribedModel> parse_described_model(const std::string& text, const std::string& origin) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return bad(origin, "not JSON");
  if (json_deeper_than(root, kMaxJsonDepth)) return bad(origin, "nested too deeply to be a model description");
  if (!root.is_object() || !root.contains("format") || root["format"] != kFormat)
    return bad(origin, fmt::format("not a model description (its \"format\" must be \"{}\": zoe.torch.describe writes it)",
                                   kFormat));
  DescribedModel m;
  const json& units = root.contains("units") ? root["units"] : json();
  if (!units.is_array() || units.empty() || units.size() > kMostUnits)
    return bad(origin, fmt::format("\"units\" must be a list of 1 to {} element counts", kMostUnits));
  for (size_t i = 0; i < units.size(); ++i) {
    ZOE_ASSIGN_OR_RETURN(int64_t e, whole(units[i], 1, int64_t{1} << 40, origin, fmt::format("units[{}]", i)));
    m.unit_elems.push_back(e);
  }
  if (root.contains("unit_names") && root["unit_names"].is_array() && root["unit_names"].size() == units.size())
    for (const json& n : root["unit_names"]) m.unit_names.push_back(n.is_string() ? n.get<std::string>() : "");
  const json& steps = root.contains("micro_steps") ? root["micro_steps"] : json();
  if (!steps.is_array() || steps.empty() || steps.size() > 4096)
    return bad(origin, "\"micro_steps\" must be a list of 1 to 4096 measured micro-steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    ZOE_ASSIGN_OR_RETURN(DescribedStep s, parse_step(steps[i], i, units.size(), origin));
    for (const DescribedStep& o : m.steps)
      if (o.micro_batch == s.micro_batch && o.checkpointing == s.checkpointing)
        return bad(origin, fmt::format("micro_steps[{}] repeats micro-batch {}{}", i, s.micro_batch,
                                       s.checkpointing ? " checkpointed" : ""));
    m.steps.push_back(std::move(s));
  }
  std::sort(m.steps.begin(), m.steps.end(), [](const DescribedStep& a, const DescribedStep& b) {
    return std::make_pair(a.micro_batch, a.checkpointing) < std::make_pair(b.micro_batch, b.checkpointing);
  });
  return m;
}

Result<DescribedModel> read_described_model(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Io("cannot open the model description " + path + ": " + std::strerror(errno));
  // Bounded (a path such as /dev/zero): ~1.6 M fetches of JSON, a thousand units' micro-steps
  // a thousand times over.
  constexpr size_t kMaxBytes = size_t{64} << 20;
  std::string text;
  if (!read_at_most(f, kMaxBytes, &text)) return bad(path, fmt::format("larger than {} bytes", kMaxBytes));
  if (f.bad()) return Status::Io("cannot read the model description " + path);
  return parse_described_model(text, path);
}

}  // namespace zoe

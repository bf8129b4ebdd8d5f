#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "ckpt/atomic_dir.h"
#include "ckpt/atomic_file.h"
#include "ckpt/checksum.h"
#include "common/posix_io.h"

namespace zoe {
namespace fs = std::filesystem;

namespace {

std::string rank_file(int r) { return fmt::format("rank_{:05d}.bin", r); }

int64_t chunk_of(int64_t numel, int world) { return (numel + world - 1) / world; }
int64_t owned_of(int64_t numel, int world, int r) {
  return std::clamp<int64_t>(numel - r * chunk_of(numel, world), 0, chunk_of(numel, world));
}

// One rank's outcome made everyone's: a rank that failed a step fails it on every rank (with
// `elsewhere` where this rank itself was fine), so no rank goes on alone into a collective.
Status agree(Comm& comm, const Status& mine,
             const Status& elsewhere = Status::Io("checkpoint save failed on another rank (see its message)")) {
  double bad = mine.ok() ? 0 : 1;
  ZOE_RETURN_IF_ERROR(comm.all_reduce_sum(&bad, 1));
  if (!mine.ok()) return mine;
  return bad > 0 ? elsewhere : Status::Ok();
}

Status broadcast_string(Comm& comm, std::string& s) {
  uint64_t n = s.size();
  ZOE_RETURN_IF_ERROR(comm.broadcast(&n, sizeof(n), 0));
  s.resize(n);
  return comm.broadcast(s.data(), n, 0);
}

Status write_rank_file(const std::string& path, Engine& e, int rank, int world, uint64_t* size, std::string* hex) {
  ZOE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
  for (int u = 0; u < e.num_units(); ++u) {
    OwnedState o = e.owned_state(u);
    int64_t numel = e.unit(u).numel, lo = rank * chunk_of(numel, world), n = owned_of(numel, world, rank);
    if (n == 0) continue;
    if (lo < o.begin || lo + n > o.end)
      return Status::Runtime(fmt::format("unit '{}': rank {} does not hold elements [{}, {})", e.unit(u).name, rank,
                                         lo, lo + n));
    for (const float* p : {o.master, o.exp_avg, o.exp_avg_sq}) ZOE_RETURN_IF_ERROR(f.append(p + (lo - o.begin), n * 4));
  }
  *size = f.bytes_written();
  *hex = f.checksum_hex();
  return f.commit();
}

nlohmann::json units_json(const Engine& e) {
  nlohmann::json units = nlohmann::json::array();
  for (int u = 0; u < e.num_units(); ++u) {
    nlohmann::json t = nlohmann::json::array();
    for (const TensorSpec& s : e.unit(u).tensors)
      t.push_back({{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}});
    units.push_back({{"name", e.unit(u).name}, {"numel", e.unit(u).numel}, {"tensors", t}});
  }
  return units;
}

// Keeps the newest `keep` checkpoints, and removes temporary directories that saves killed
// mid-way left behind (one writer per root: ours has been renamed into place already).
Status prune(const std::string& root, int keep) {
  std::vector<std::string> dirs;
  std::error_code ec;
  static const std::regex kName("step_[0-9]{8}"), kTmp("step_[0-9]{8}\\.tmp\\.[0-9]+");
  for (auto& d : fs::directory_iterator(root, ec)) {
    std::string name = d.path().filename().string();
    if (!d.is_directory()) continue;
    if (std::regex_match(name, kName)) dirs.push_back(d.path().string());
    else if (std::regex_match(name, kTmp)) fs::remove_all(d.path(), ec);
  }
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + keep < dirs.size(); ++i) fs::remove_all(dirs[i], ec);
  return Status::Ok();
}

}  // namespace

Result<std::string> save_checkpoint(const std::string& root, Engine& e, Comm& comm, const nlohmann::json& config,
                                    int stage, const TrainState& st, int keep) {
  std::string final_path = fmt::format("{}/step_{:08d}", root, st.steps_done);
  std::optional<AtomicDir> dir;
  std::string tmp;
  Status made = Status::Ok();
  if (comm.rank() == 0) {
    auto d = AtomicDir::Create(final_path);
    made = d.status();
    if (d.ok()) {
      tmp = d->path();
      dir.emplace(std::move(d).value());
    }
  }
  ZOE_RETURN_IF_ERROR(agree(comm, made));
  ZOE_RETURN_IF_ERROR(broadcast_string(comm, tmp));
  struct FileFacts {
    uint64_t size;
    char hex[24];
  } mine{};
  std::string hex;
  Status wrote = write_rank_file(tmp + "/" + rank_file(comm.rank()), e, comm.rank(), comm.size(), &mine.size, &hex);
  std::snprintf(mine.hex, sizeof(mine.hex), "%s", hex.c_str());
  ZOE_RETURN_IF_ERROR(agree(comm, wrote));
  std::vector<FileFacts> all(comm.rank() == 0 ? comm.size() : 1);
  ZOE_RETURN_IF_ERROR(comm.gather_to_root(&mine, all.data(), sizeof(FileFacts)));
  Status done = Status::Ok();
  if (comm.rank() == 0) {
    nlohmann::json files = nlohmann::json::array();
    for (int r = 0; r < comm.size(); ++r)
      files.push_back({{"name", rank_file(r)}, {"bytes", all[r].size}, {"xxh3", std::string(all[r].hex)}});
    nlohmann::json m = {{"format", "zoe-checkpoint"}, {"format_version", kCheckpointFormat},
                        {"step", st.steps_done}, {"steps_applied", st.steps_applied}, {"world_size", comm.size()},
                        {"stage", stage}, {"config", config}, {"units", units_json(e)}, {"files", files},
                        {"train_state", {{"loss_scale", st.loss_scale}, {"scaler_good_steps", st.scaler_good_steps},
                                         {"scaler_hysteresis", st.scaler_hysteresis},
                                         {"data_position", st.data_position}, {"data_shard", st.data_shard},
                                         {"last_loss", st.last_loss}}}};
    done = write_file_atomic(tmp + "/manifest.json", m.dump(2) + "\n");
    if (done.ok()) done = dir->commit();
    if (done.ok()) done = prune(root, keep);
  }
  ZOE_RETURN_IF_ERROR(agree(comm, done));
  return final_path;
}

Result<std::string> latest_checkpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::string();
  static const std::regex kName("step_[0-9]{8}");
  std::vector<std::string> dirs;
  for (auto& d : fs::directory_iterator(root, ec))
    if (d.is_directory() && std::regex_match(d.path().filename().string(), kName)) dirs.push_back(d.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs.empty() ? std::string() : dirs.back();
}

static Result<nlohmann::json> read_manifest_impl(const std::string& path) {
  std::ifstream f(path + "/manifest.json");
  if (!f) return Status::Corrupt(fmt::format("checkpoint '{}': manifest.json is missing (incomplete checkpoint)", path));
  nlohmann::json m = nlohmann::json::parse(f, nullptr, false);
  if (m.is_discarded() || !m.is_object())
    return Status::Corrupt(fmt::format("checkpoint '{}': manifest.json is not valid JSON", path));
  for (const char* k : {"format_version", "step", "world_size", "units", "files", "train_state"})
    if (!m.contains(k)) return Status::Corrupt(fmt::format("checkpoint '{}': manifest.json lacks '{}'", path, k));
  if (m["format_version"] != kCheckpointFormat)
    return Status::Corrupt(fmt::format("checkpoint '{}': format version {} (this zoe reads {})", path,
                                       m["format_version"].dump(), kCheckpointFormat));
  int world = m["world_size"].get<int>();
  if (world < 1 || static_cast<int>(m["files"].size()) != world)
    return Status::Corrupt(fmt::format("checkpoint '{}': {} files listed for world size {}", path, m["files"].size(), world));
  for (auto& file : m["files"]) {
    std::string p = path + "/" + file["name"].get<std::string>();
    std::error_code ec;
    auto size = fs::file_size(p, ec);
    if (ec) return Status::Corrupt(fmt::format("checkpoint '{}': file {} is missing", path, file["name"].get<std::string>()));
    if (size != file["bytes"].get<uint64_t>())
      return Status::Corrupt(fmt::format("checkpoint '{}': file {} has {} bytes, the manifest says {} (truncated?)",
                                         path, file["name"].get<std::string>(), size, file["bytes"].get<uint64_t>()));
  }
  return m;
}

namespace {

// Reads elements [lo, hi) of unit u's `block` (0 master, 1 exp_avg, 2 exp_avg_sq) from the saved
// chunks into out[0, hi-lo).
class ChunkReader {
 public:
  ChunkReader(std::string path, nlohmann::json m) : path_(std::move(path)), m_(std::move(m)) {
    world_ = m_["world_size"].get<int>();
    fds_.assign(world_, -1);
  }
  ~ChunkReader() {
    for (int fd : fds_)
      if (fd >= 0) close(fd);
  }
  Status verify_file(int q) {
    std::string p = file(q);
    ZOE_ASSIGN_OR_RETURN(std::string sum, checksum_file(p));
    if (sum != m_["files"][q]["xxh3"].get<std::string>())
      return Status::Corrupt(fmt::format("checkpoint '{}': file {} fails its xxh3 checksum (corrupt)", path_,
                                         m_["files"][q]["name"].get<std::string>()));
    return Status::Ok();
  }
  Status read(int u, int block, int64_t lo, int64_t hi, float* out, bool verify) {
    int64_t numel = m_["units"][u]["numel"].get<int64_t>(), c = chunk_of(numel, world_);
    for (int q = 0; q < world_ && lo < hi; ++q) {
      int64_t qlo = q * c, qn = owned_of(numel, world_, q), a = std::max(lo, qlo), b = std::min(hi, qlo + qn);
      if (a >= b) continue;
      if (fds_[q] < 0) {
        if (verify) ZOE_RETURN_IF_ERROR(verify_file(q));
        fds_[q] = open(file(q).c_str(), O_RDONLY | O_CLOEXEC);
        if (fds_[q] < 0) return open_error(file(q), "checkpoint file", errno);
      }
      uint64_t off = 0;  // floats before unit u in file q, then this block, then the element
      for (int v = 0; v < u; ++v) off += 3 * owned_of(m_["units"][v]["numel"].get<int64_t>(), world_, q);
      off += block * qn + (a - qlo);
      ZOE_RETURN_IF_ERROR(pread_all(fds_[q], out + (a - lo), (b - a) * 4, off * 4, file(q)));
    }
    return Status::Ok();
  }

 private:
  std::string file(int q) const { return path_ + "/" + m_["files"][q]["name"].get<std::string>(); }
  std::string path_;
  nlohmann::json m_;
  int world_;
  std::vector<int> fds_;
};

}  // namespace

static Status load_checkpoint_impl(const std::string& path, Engine& e, bool verify, TrainState* st) {
  ZOE_ASSIGN_OR_RETURN(nlohmann::json m, read_manifest_impl(path));
  auto& units = m["units"];
  if (static_cast<int>(units.size()) != e.num_units())
    return Status::Invalid(fmt::format("checkpoint '{}' has {} units, the configured model {}", path, units.size(),
                                       e.num_units()));
  for (int u = 0; u < e.num_units(); ++u)
    if (units[u]["name"] != e.unit(u).name || units[u]["numel"].get<int64_t>() != e.unit(u).numel)
      return Status::Invalid(fmt::format("checkpoint '{}': unit {} is '{}' with {} elements, the configured model has "
                                         "'{}' with {}", path, u, units[u]["name"].get<std::string>(),
                                         units[u]["numel"].get<int64_t>(), e.unit(u).name, e.unit(u).numel));
  ChunkReader reader(path, m);
  for (int u = 0; u < e.num_units(); ++u) {
    OwnedState o = e.owned_state(u);
    float* blocks[] = {o.master, o.exp_avg, o.exp_avg_sq};
    for (int b = 0; b < 3; ++b) ZOE_RETURN_IF_ERROR(reader.read(u, b, o.begin, o.end, blocks[b], verify));
  }
  auto& ts = m["train_state"];
  st->steps_done = m["step"].get<int64_t>();
  st->steps_applied = m["steps_applied"].get<int64_t>();
  st->loss_scale = ts["loss_scale"].get<double>();
  st->scaler_good_steps = ts["scaler_good_steps"].get<int64_t>();
  st->scaler_hysteresis = ts["scaler_hysteresis"].get<int>();
  st->data_position = ts["data_position"].get<int64_t>();
  st->data_shard = ts["data_shard"].get<uint64_t>();
  st->last_loss = ts["last_loss"].get<double>();
  e.restore_counters(st->steps_applied, st->loss_scale, st->scaler_good_steps, st->scaler_hysteresis);
  return Status::Ok();
}

static Result<std::vector<NamedTensor>> read_weights_impl(const std::string& path, bool verify) {
  ZOE_ASSIGN_OR_RETURN(nlohmann::json m, read_manifest_impl(path));
  ChunkReader reader(path, m);
  std::vector<NamedTensor> out;
  for (size_t u = 0; u < m["units"].size(); ++u) {
    auto& unit = m["units"][u];
    std::vector<float> all(unit["numel"].get<int64_t>());
    ZOE_RETURN_IF_ERROR(reader.read(static_cast<int>(u), 0, 0, static_cast<int64_t>(all.size()), all.data(), verify));
    for (auto& t : unit["tensors"]) {
      NamedTensor nt{t["name"].get<std::string>(), t["shape"].get<std::vector<int64_t>>(), {}};
      int64_t n = 1, off = t["offset"].get<int64_t>();
      for (int64_t d : nt.shape) n *= d;
      nt.values.assign(all.begin() + off, all.begin() + off + n);
      out.push_back(std::move(nt));
    }
  }
  return out;
}

// A manifest with a field of the wrong type surfaces as a json exception: one clear error instead.
template <typename F>
static auto guarded(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const nlohmann::json::exception& ex) {
    return Status::Corrupt(fmt::format("checkpoint '{}': malformed manifest.json ({})", path, ex.what()));
  }
}

Result<nlohmann::json> read_manifest(const std::string& path) {
  return guarded(path, [&] { return read_manifest_impl(path); });
}

Status load_checkpoint(const std::string& path, Engine& e, Comm& comm, bool verify, TrainState* st) {
  Status s = guarded(path, [&] { return load_checkpoint_impl(path, e, verify, st); });
  ZOE_RETURN_IF_ERROR(
      agree(comm, s, Status::Corrupt(fmt::format("checkpoint '{}': another rank failed to load it", path))));
  return e.commit_owned_state();  // collective: only once every rank holds its state
}

Result<std::vector<NamedTensor>> read_consolidated_weights(const std::string& path, bool verify) {
  return guarded(path, [&] { return read_weights_impl(path, verify); });
}

}  // namespace zoe

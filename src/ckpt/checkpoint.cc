#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "ckpt/atomic_dir.h"
#include "ckpt/atomic_file.h"
#include "common/checksum.h"
#include "common/posix_io.h"

namespace zoe {
namespace fs = std::filesystem;

namespace {

// State moves between the engine and checkpoint files in pieces of this many elements (16 MiB).
constexpr int64_t kPieceElems = int64_t{1} << 22;

// manifest.json is small; anything far larger is not one of ours.
constexpr size_t kMaxManifestBytes = size_t{64} << 20;

Status agree_save(Comm& comm, const Status& mine) {
  return agree(comm, mine, Status::Io("checkpoint save failed on another rank (see its message)"));
}

Status broadcast_string(Comm& comm, std::string& s) {
  uint64_t n = s.size();
  ZOE_RETURN_IF_ERROR(comm.broadcast(&n, sizeof(n), 0));
  s.resize(n);
  return comm.broadcast(s.data(), n, 0);
}

Status write_rank_file(const std::string& path, Engine& e, int rank, int world, uint64_t* size, std::string* hex) {
  ZOE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
  std::vector<float> piece;
  for (int u = 0; u < e.num_units(); ++u) {
    OwnedRange o = e.owned_range(u);
    int64_t numel = e.unit(u).numel, lo = rank * manifest_chunk(numel, world), n = manifest_owned(numel, world, rank);
    if (n == 0) continue;
    if (lo < o.begin || lo + n > o.end)
      return Status::Runtime(fmt::format("unit '{}': rank {} does not hold elements [{}, {})", e.unit(u).name, rank,
                                         lo, lo + n));
    // State may live on NVMe: it streams through a bounded piece, never a whole-state copy.
    for (OwnedKind k : {OwnedKind::kMaster, OwnedKind::kExpAvg, OwnedKind::kExpAvgSq})
      for (int64_t x = lo; x < lo + n; x += kPieceElems) {
        int64_t m = std::min(kPieceElems, lo + n - x);
        piece.resize(m);
        ZOE_RETURN_IF_ERROR(e.read_owned(u, k, x, x + m, piece.data()));
        ZOE_RETURN_IF_ERROR(f.append(piece.data(), m * 4));
      }
  }
  *size = f.bytes_written();
  *hex = f.checksum_hex();
  return f.commit();
}

std::vector<ManifestUnit> manifest_units(const Engine& e) {
  std::vector<ManifestUnit> units;
  for (int u = 0; u < e.num_units(); ++u) {
    ManifestUnit mu{e.unit(u).name, e.unit(u).numel, {}};
    for (const TensorSpec& s : e.unit(u).tensors) mu.tensors.push_back({s.name, s.shape, s.offset, s.numel});
    units.push_back(std::move(mu));
  }
  return units;
}

// Step directories are named with at least 8 digits (step_00000042, step_123456789): at most 18,
// so the number fits an int64.
const std::regex kStepName("step_([0-9]{8,18})");
const std::regex kStepTmpName("step_[0-9]{8,18}\\.tmp\\.[0-9]+");

// The root's `step_*` directories, oldest first by step number, not by name: names of different
// widths (step_99999999, step_100000000) sort wrongly as text.
std::vector<std::string> step_dirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  std::smatch m;
  for (auto& d : fs::directory_iterator(root, ec)) {
    std::string name = d.path().filename().string();
    if (!d.is_symlink(ec) && d.is_directory(ec) && std::regex_match(name, m, kStepName))
      found.emplace_back(std::stoll(m[1].str()), d.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> dirs;
  for (auto& f : found) dirs.push_back(std::move(f.second));
  return dirs;
}

}  // namespace

Status prune_checkpoints(const std::string& root, int keep) {
  std::error_code ec;
  for (auto& d : fs::directory_iterator(root, ec))
    if (d.is_directory(ec) && std::regex_match(d.path().filename().string(), kStepTmpName)) {
      fs::remove_all(d.path(), ec);
      if (ec) return Status::Io(fmt::format("cannot remove '{}': {}", d.path().string(), ec.message()));
    }
  // Only directories that hold a complete, valid zoe manifest count and may go: a step_* directory
  // without one may be the user's, whatever its name.
  std::vector<std::string> dirs;
  for (std::string& d : step_dirs(root))
    if (read_manifest(d).ok()) dirs.push_back(std::move(d));
  for (size_t i = 0; i + keep < dirs.size(); ++i) {
    fs::remove_all(dirs[i], ec);
    if (ec) return Status::Io(fmt::format("cannot remove old checkpoint '{}': {}", dirs[i], ec.message()));
  }
  return Status::Ok();
}

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
  ZOE_RETURN_IF_ERROR(agree_save(comm, made));
  ZOE_RETURN_IF_ERROR(broadcast_string(comm, tmp));
  struct FileFacts {
    uint64_t size;
    char hex[24];
  } mine{};
  std::string hex;
  Status wrote = write_rank_file(tmp + "/" + manifest_rank_file_name(comm.rank()), e, comm.rank(), comm.size(), &mine.size, &hex);
  std::snprintf(mine.hex, sizeof(mine.hex), "%s", hex.c_str());
  ZOE_RETURN_IF_ERROR(agree_save(comm, wrote));
  std::vector<FileFacts> all(comm.rank() == 0 ? comm.size() : 1);
  ZOE_RETURN_IF_ERROR(comm.gather_to_root(&mine, all.data(), sizeof(FileFacts)));
  Status done = Status::Ok();
  if (comm.rank() == 0) {
    CheckpointManifest m;
    m.world_size = comm.size();
    m.stage = stage;
    m.config = config;
    m.units = manifest_units(e);
    for (int r = 0; r < comm.size(); ++r) m.files.push_back({manifest_rank_file_name(r), all[r].size, std::string(all[r].hex)});
    m.train_state = st;
    // The manifest's own checksum sits beside it, so a damaged manifest is never trusted.
    std::string text = manifest_to_text(m);
    done = write_file_atomic(tmp + "/" + kManifestName, text);
    if (done.ok()) done = write_file_atomic(tmp + "/" + kManifestSumName, checksum_buffer(text.data(), text.size()) + "\n");
    if (done.ok()) done = dir->commit();
    if (done.ok()) done = prune_checkpoints(root, keep);
  }
  ZOE_RETURN_IF_ERROR(agree_save(comm, done));
  return final_path;
}


Result<std::string> latest_checkpoint(const std::string& root, std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::string();
  std::vector<std::string> dirs = step_dirs(root);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (fs::is_regular_file(*it + "/" + kManifestName, ec)) return *it;
    if (skipped) skipped->push_back(fmt::format("skipping incomplete checkpoint '{}' (no {})", *it, kManifestName));
  }
  return std::string();
}

Result<std::string> agree_latest_checkpoint(const std::string& root, Comm& comm, std::vector<std::string>* skipped) {
  std::string path;
  Status listed = Status::Ok();
  if (comm.rank() == 0) {
    auto latest = latest_checkpoint(root, skipped);
    listed = latest.status();
    if (latest.ok()) path = std::move(latest).value();
  }
  ZOE_RETURN_IF_ERROR(agree(comm, listed, Status::Io("rank 0 could not list the checkpoint directory")));
  ZOE_RETURN_IF_ERROR(broadcast_string(comm, path));
  return path;
}

namespace {

Result<std::string> read_small_file(const std::string& path, const std::string& dir, const char* name) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec)))
    return Status::Corrupt(fmt::format("checkpoint '{}': {} is missing (incomplete checkpoint)", dir, name));
  // A FIFO or device under the manifest's name is refused at once, never read (or waited on).
  ZOE_ASSIGN_OR_RETURN(InputFile f, open_input_file(path, fmt::format("checkpoint '{}': {}", dir, name), UINT64_MAX));
  if (f.size > kMaxManifestBytes)
    return Status::Corrupt(fmt::format("checkpoint '{}': {} is larger than {} bytes", dir, name, kMaxManifestBytes));
  std::string text(f.size + 1, '\0');  // one byte more: a file that grew since fstat is seen
  auto n = read_upto(f.fd.get(), text.data(), text.size(), path);
  if (!n.ok()) return n.status();
  if (*n > f.size)
    return Status::Corrupt(fmt::format("checkpoint '{}': {} grew while it was read", dir, name));
  text.resize(*n);
  return text;
}

}  // namespace

// Where each unit starts in each rank file: 3 x the elements file q holds of the units before u.
// Reads come in unit order, so a Fenwick tree over ranks takes in each passed unit's chunks (a
// range add of c over the ranks that own a full chunk, the remainder at the next): memory ranks
// + units, where a table would be ranks x units (terabytes for a hostile 64 MiB manifest).
// Outside the anonymous namespace: ChunkReader, declared in checkpoint.h, holds one.
class UnitOffsets {
 public:
  UnitOffsets(const std::vector<ManifestUnit>& units, int world) : units_(units), world_(world) { reset(); }
  // Floats in file q before unit u.
  uint64_t base(int q, size_t u) {
    if (u < passed_) reset();  // reads went back to an earlier unit: start over
    for (; passed_ < u; ++passed_) {
      int64_t numel = units_[passed_].numel, c = manifest_chunk(numel, world_), full = numel / c;
      add(0, c);
      add(full, -c);
      add(full, numel - full * c);
      add(full + 1, -(numel - full * c));
    }
    int64_t elems = 0;  // the difference array's prefix sum at q
    for (size_t i = static_cast<size_t>(q) + 1; i > 0; i -= i & (~i + 1)) elems += tree_[i];
    return 3 * static_cast<uint64_t>(elems);
  }

 private:
  void reset() {
    tree_.assign(static_cast<size_t>(world_) + 3, 0);
    passed_ = 0;
  }
  void add(int64_t at, int64_t v) {
    for (size_t i = static_cast<size_t>(at) + 1; i < tree_.size(); i += i & (~i + 1)) tree_[i] += v;
  }

  const std::vector<ManifestUnit>& units_;
  int world_;
  std::vector<int64_t> tree_;
  size_t passed_ = 0;
};

// Reads elements [lo, hi) of unit u's `block` (0 master, 1 exp_avg, 2 exp_avg_sq) from the saved
// chunks into out[0, hi-lo). Every offset comes from a validated manifest and checked file sizes.
class ChunkReader {
 public:
  ChunkReader(std::string path, const CheckpointManifest& m)
      : path_(std::move(path)), m_(m), world_(m.world_size), fds_(world_, -1), verified_(world_, false),
        offsets_(m.units, world_) {}
  ~ChunkReader() {
    for (int fd : fds_)
      if (fd >= 0) close(fd);
  }
  Status read(int u, int block, int64_t lo, int64_t hi, float* out, bool verify) {
    int64_t numel = m_.units[u].numel, c = manifest_chunk(numel, world_);
    if (lo < 0 || hi > numel || lo > hi)
      return Status::Runtime(fmt::format("checkpoint read of [{}, {}) outside unit '{}'", lo, hi, m_.units[u].name));
    for (int q = static_cast<int>(lo / c); q < world_ && q * c < hi; ++q) {
      int64_t qlo = q * c, qn = manifest_owned(numel, world_, q), a = std::max(lo, qlo), b = std::min(hi, qlo + qn);
      if (a >= b) continue;
      ZOE_RETURN_IF_ERROR(open_file(q, verify));
      uint64_t off = offsets_.base(q, u) + block * qn + (a - qlo);
      ZOE_RETURN_IF_ERROR(pread_all(fds_[q], out + (a - lo), (b - a) * 4, off * 4, file(q)));
    }
    return Status::Ok();
  }
  Status verify_file(int q) {
    if (verified_[q]) return Status::Ok();
    ZOE_ASSIGN_OR_RETURN(std::string sum, checksum_file(file(q)));
    if (sum != m_.files[q].xxh3)
      return Status::Corrupt(
          fmt::format("checkpoint '{}': file {} fails its xxh3 checksum (corrupt)", path_, m_.files[q].name));
    verified_[q] = true;
    return Status::Ok();
  }

 private:
  // At most half the descriptor limit (256 at most) open at once: a checkpoint of thousands of
  // ranks must not run the process out of descriptors (EMFILE). The lowest-numbered open files
  // are closed first; a file reopened is not verified again.
  static int max_open() {
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 256;
    return static_cast<int>(std::clamp<rlim_t>(r.rlim_cur / 2, 1, 256));
  }
  Status open_file(int q, bool verify) {
    if (fds_[q] >= 0) return Status::Ok();
    if (verify) ZOE_RETURN_IF_ERROR(verify_file(q));
    static const int kMaxOpen = max_open();
    for (int k = 0; open_ >= kMaxOpen && k < world_; ++k)
      if (fds_[k] >= 0) {
        close(fds_[k]);
        fds_[k] = -1;
        --open_;
      }
    ZOE_ASSIGN_OR_RETURN(InputFile f, open_input_file(file(q), "checkpoint file", UINT64_MAX));
    fds_[q] = f.fd.release();
    ++open_;
    return Status::Ok();
  }
  std::string file(int q) const { return path_ + "/" + m_.files[q].name; }

  std::string path_;
  const CheckpointManifest& m_;
  int world_;
  std::vector<int> fds_;  // opened when first read: a rank reads only the files its range overlaps
  int open_ = 0;          // of fds_
  std::vector<bool> verified_;
  UnitOffsets offsets_;
};

Result<CheckpointManifest> read_manifest(const std::string& path) {
  ZOE_ASSIGN_OR_RETURN(std::string text, read_small_file(path + "/" + kManifestName, path, kManifestName));
  std::error_code ec;
  bool has_sum = fs::exists(path + "/" + kManifestSumName, ec);
  if (has_sum) {
    ZOE_ASSIGN_OR_RETURN(std::string sum, read_small_file(path + "/" + kManifestSumName, path, kManifestSumName));
    while (!sum.empty() && (sum.back() == '\n' || sum.back() == ' ')) sum.pop_back();
    if (sum != checksum_buffer(text.data(), text.size()))
      return Status::Corrupt(fmt::format("checkpoint '{}': {} fails the checksum kept in {} (corrupt)", path,
                                         kManifestName, kManifestSumName));
  }
  ZOE_ASSIGN_OR_RETURN(CheckpointManifest m, parse_manifest(text, path));
  if (!has_sum && m.format_version >= 2)
    return Status::Corrupt(fmt::format("checkpoint '{}': {} is missing (incomplete checkpoint)", path, kManifestSumName));
  for (const ManifestFile& file : m.files) {
    std::string p = path + "/" + file.name;
    auto st = fs::symlink_status(p, ec);
    if (ec || !fs::is_regular_file(st))
      return Status::Corrupt(fmt::format("checkpoint '{}': file {} is missing or not a regular file", path, file.name));
    auto size = fs::file_size(p, ec);
    if (ec || size != file.bytes)
      return Status::Corrupt(fmt::format("checkpoint '{}': file {} has {} bytes, the manifest says {} (truncated?)",
                                         path, file.name, ec ? 0 : size, file.bytes));
  }
  return m;
}

static Status load_checkpoint_impl(const std::string& path, Engine& e, bool verify, TrainState* st) {
  ZOE_ASSIGN_OR_RETURN(CheckpointManifest m, read_manifest(path));
  if (static_cast<int>(m.units.size()) != e.num_units())
    return Status::Invalid(fmt::format("checkpoint '{}' has {} units, the configured model {}", path, m.units.size(),
                                       e.num_units()));
  for (int u = 0; u < e.num_units(); ++u)
    if (m.units[u].name != e.unit(u).name || m.units[u].numel != e.unit(u).numel)
      return Status::Invalid(fmt::format("checkpoint '{}': unit {} is '{}' with {} elements, the configured model has "
                                         "'{}' with {}", path, u, m.units[u].name, m.units[u].numel, e.unit(u).name,
                                         e.unit(u).numel));
  ChunkReader reader(path, m);
  std::vector<float> piece;
  for (int u = 0; u < e.num_units(); ++u) {
    OwnedRange o = e.owned_range(u);
    for (int b = 0; b < 3; ++b)
      for (int64_t x = o.begin; x < o.end; x += kPieceElems) {
        int64_t k = std::min(kPieceElems, o.end - x);
        piece.resize(k);
        ZOE_RETURN_IF_ERROR(reader.read(u, b, x, x + k, piece.data(), verify));
        ZOE_RETURN_IF_ERROR(e.write_owned(u, static_cast<OwnedKind>(b), x, x + k, piece.data()));
      }
  }
  *st = m.train_state;
  return Status::Ok();
}

Status load_checkpoint(const std::string& path, Engine& e, Comm& comm, bool verify, TrainState* st) {
  Status s = load_checkpoint_impl(path, e, verify, st);
  ZOE_RETURN_IF_ERROR(
      agree(comm, s, Status::Corrupt(fmt::format("checkpoint '{}': another rank failed to load it", path))));
  return e.commit_owned_state();  // collective: only once every rank holds its state
}

Result<std::unique_ptr<CheckpointWeights>> CheckpointWeights::Open(const std::string& path) {
  ZOE_ASSIGN_OR_RETURN(CheckpointManifest m, read_manifest(path));
  std::unique_ptr<CheckpointWeights> w(new CheckpointWeights(path, std::move(m)));
  // Every file verified before the first byte is used (or written out); opened only when read.
  for (int q = 0; q < w->manifest_.world_size; ++q) ZOE_RETURN_IF_ERROR(w->reader_->verify_file(q));
  return w;
}

CheckpointWeights::CheckpointWeights(std::string path, CheckpointManifest m)
    : path_(std::move(path)), manifest_(std::move(m)), reader_(std::make_unique<ChunkReader>(path_, manifest_)) {}

CheckpointWeights::~CheckpointWeights() = default;

Status CheckpointWeights::append_tensor(size_t u, const ManifestTensor& t, AtomicFile& out) {
  std::vector<float> piece;
  for (int64_t x = 0; x < t.numel; x += kPieceElems) {
    int64_t n = std::min(kPieceElems, t.numel - x);
    piece.resize(n);
    ZOE_RETURN_IF_ERROR(reader_->read(static_cast<int>(u), 0, t.offset + x, t.offset + x + n, piece.data(), false));
    ZOE_RETURN_IF_ERROR(out.append(piece.data(), n * 4));
  }
  return Status::Ok();
}

}  // namespace zoe

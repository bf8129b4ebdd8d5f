#include "nvme/nvme_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "common/round_up.h"
#include "common/signal_exit.h"
#include "nvme/io_error.h"
#include "nvme/io_worker.h"
#include "nvme/transfer.h"

namespace zoe {

namespace {

// mkdir -p: nvme_path and any missing parents.
Status create_dirs(NvmeEnv* env, const std::string& path) {
  for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
    ZOE_RETURN_IF_ERROR(env->create_dir(path.substr(0, at)));
  return env->create_dir(path);
}

// What marks a directory as a zoe swap directory: created inside it, only while its creator
// holds the directory's lock, so a directory without it is either not zoe's or one whose creator
// is between mkdir and lock, and neither is removed.
constexpr char kMarker[] = ".zoe-lock";

bool plain_name(std::string_view s) {
  if (s.empty() || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  });
}

// zoe-<job>-rank<digits>: a name the store makes.
bool job_dir_name(const std::string& name) {
  const size_t at = name.rfind("-rank");
  if (name.rfind("zoe-", 0) != 0 || at == std::string::npos || at < 4 || at + 5 == name.size()) return false;
  return plain_name(name) && std::all_of(name.begin() + at + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A swap file name the store makes: <plain region name>.swap.
bool swap_name(const std::string& name) { return name.ends_with(".swap") && name.size() > 5 && plain_name(name); }

// What a signal that ends the `zoe` command removes of a live store (SignalExit): its swap files
// and marker, then its directory, all through the descriptors the store holds (never by path).
void remove_store_files(int dir_fd, int parent_fd, const std::string& dir_name) {
  int d = ::dup(dir_fd);
  DIR* dp = d >= 0 ? ::fdopendir(d) : nullptr;
  if (!dp) {
    if (d >= 0) ::close(d);
    return;
  }
  ::rewinddir(dp);
  while (dirent* e = ::readdir(dp)) {
    std::string name = e->d_name;
    if (swap_name(name) || name == kMarker) ::unlinkat(dir_fd, name.c_str(), 0);
  }
  ::closedir(dp);
  ::unlinkat(parent_fd, dir_name.c_str(), AT_REMOVEDIR);
}

// An open directory, closed unless released.
class DirHolder {
 public:
  DirHolder(NvmeEnv* env, Dir d) : env_(env), d_(std::move(d)) {}
  ~DirHolder() { env_->close_fd(d_.fd); }
  DirHolder(const DirHolder&) = delete;
  DirHolder& operator=(const DirHolder&) = delete;
  const Dir& get() const { return d_; }
  Dir release() {
    Dir d = std::move(d_);
    d_.fd = -1;
    return d;
  }

 private:
  NvmeEnv* env_;
  Dir d_;
};

// A directory zoe made before swap directories carried the marker (before cc3ffbe), provably so:
// mode 0700, and inside only regular files of the owner named like swap files, at least one. A
// job of today's zoe puts files in only after its marker, so an unmarked directory with swap files
// in it is no job starting up; an empty one may be, and is left alone.
bool old_format_dead_job(NvmeEnv* env, const Dir& d, const EntryInfo& self, const std::vector<std::string>& files) {
  if (self.mode != 0700 || files.empty()) return false;
  for (const std::string& f : files) {
    Result<EntryInfo> e = env->stat_at(d, f);
    if (!swap_name(f) || !e.ok() || e->kind != EntryInfo::Kind::kFile || e->owner != ::geteuid()) return false;
  }
  return true;
}

// Directories of other jobs whose lock nobody holds belong to jobs that died: their swap files
// are scratch. Only what zoe made qualifies: real directories (never a link), ours by owner,
// carrying the marker (or made by zoe before the marker: old_format_dead_job). `found` gets each
// such directory, open and locked, with its entries (`own`, this job's, is never one).
void for_each_dead_job(NvmeEnv* env, const Dir& parent, const std::string& own,
                       const std::function<void(const Dir&, const std::string&, const std::vector<std::string>&)>& found) {
  Result<std::vector<std::string>> names = env->list_dir(parent);
  if (!names.ok()) return;  // nothing of ours depends on it
  for (const std::string& name : *names) {
    if (!job_dir_name(name) || name == own) continue;
    Result<EntryInfo> info = env->stat_at(parent, name);
    if (!info.ok() || info->kind != EntryInfo::Kind::kDir || info->owner != ::geteuid()) continue;
    Result<Dir> opened = env->open_dir_at(parent, name);  // O_NOFOLLOW: a link swapped in since fails
    if (!opened.ok()) continue;
    DirHolder d(env, std::move(opened).value());
    Result<bool> locked = env->try_lock(d.get());
    if (!locked.ok() || !*locked) continue;  // alive
    Result<EntryInfo> self = env->stat_at(d.get(), "");
    Result<EntryInfo> marker = env->stat_at(d.get(), kMarker);
    if (!self.ok() || self->owner != ::geteuid() || !marker.ok()) continue;
    Result<std::vector<std::string>> files = env->list_dir(d.get());
    if (!files.ok()) continue;
    if (marker->kind != EntryInfo::Kind::kFile && !old_format_dead_job(env, d.get(), *self, *files)) continue;
    found(d.get(), name, *files);
  }
}

// Dead jobs' swap files are removed, all unlinked through their directory's descriptor; a
// directory holding anything else keeps it, and its marker.
void remove_dead_jobs(NvmeEnv* env, const Dir& parent, const std::string& own) {
  for_each_dead_job(env, parent, own, [&](const Dir& d, const std::string& name, const std::vector<std::string>& files) {
    bool only_ours = true;
    for (const std::string& f : files) {
      if (swap_name(f)) (void)env->remove_file_at(d, f);
      else only_ours = only_ours && f == kMarker;
    }
    if (!only_ours) return;  // someone else's files: the directory stays, marked for the next job
    (void)env->remove_file_at(d, kMarker);
    (void)env->remove_dir_at(parent, name);
  });
}

// Makes (mkdir 0700) and locks this store's directory, or takes over one a dead run of the same
// job left, and refuses any other: a link, another owner's, a mode other than 0700, one without
// the marker. Stale swap files inside are unlinked.
Result<Dir> open_job_dir(NvmeEnv* env, const Dir& parent, const std::string& name) {
  ZOE_ASSIGN_OR_RETURN(bool created, env->make_dir_at(parent, name));
  ZOE_ASSIGN_OR_RETURN(Dir opened, env->open_dir_at(parent, name));
  DirHolder d(env, std::move(opened));
  // Locked before anything is put inside: a cleanup that opens it meanwhile finds no marker.
  // Such a cleanup holds the lock for a moment: a directory made just now is tried again.
  bool locked = false;
  for (int attempt = 0; attempt < 100 && !locked; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ZOE_ASSIGN_OR_RETURN(locked, env->try_lock(d.get()));
    if (!created) break;
  }
  if (!locked)
    return Status::Invalid(d.get().path + ": in use by another zoe store (flock LOCK_EX|LOCK_NB); a swap "
                           "directory is named after its job's pid, a random part and the rank, so this one "
                           "belongs to another store of this job and rank");
  if (created) ZOE_RETURN_IF_ERROR(env->make_private(d.get()));  // whatever the umask and a setgid parent
  ZOE_ASSIGN_OR_RETURN(EntryInfo self, env->stat_at(d.get(), ""));
  if (self.owner != ::geteuid() || self.mode != 0700)
    return Status::Invalid(fmt::format("{}: owned by uid {} with mode {:04o}; zoe uses only a swap directory it "
                                       "made itself (owner uid {}, mode 0700): remove it or point nvme_path elsewhere",
                                       d.get().path, self.owner, self.mode, ::geteuid()));
  if (created) {
    ZOE_RETURN_IF_ERROR(env->create_file_at(d.get(), kMarker));
  } else {
    ZOE_ASSIGN_OR_RETURN(EntryInfo marker, env->stat_at(d.get(), kMarker));
    if (marker.kind != EntryInfo::Kind::kFile)
      return Status::Invalid(d.get().path + ": exists but was not made by zoe (no " + kMarker +
                             " file); zoe uses only a swap directory it made itself: remove it or point nvme_path "
                             "elsewhere");
    // Swap files of a run that died: ours now that we hold the lock, and scratch by definition.
    ZOE_ASSIGN_OR_RETURN(std::vector<std::string> stale, env->list_dir(d.get()));
    for (const std::string& f : stale)
      if (swap_name(f)) ZOE_RETURN_IF_ERROR(env->remove_file_at(d.get(), f));
  }
  return d.release();
}

// nvme_path, made if missing (parents too), with a link resolved once: the store then works
// inside the directory it names, and says so the first time it meets it.
Result<Dir> open_nvme_path(NvmeEnv* env, const std::string& nvme_path) {
  ZOE_RETURN_IF_ERROR(create_dirs(env, nvme_path));
  bool was_link = false;
  ZOE_ASSIGN_OR_RETURN(std::string real, env->resolve(nvme_path, &was_link));
  if (was_link) {
    static std::mutex mu;
    static std::set<std::string> told;
    std::lock_guard l(mu);
    if (told.insert(nvme_path).second)
      std::fprintf(stderr, "zoe: nvme_path %s is a symbolic link: swap files go to %s\n", nvme_path.c_str(),
                   real.c_str());
  }
  return env->open_dir(real);
}

constexpr uint64_t kPage = 4096;

// Where a block stops at a segment's end: the direct-I/O alignment, but at least a page, since
// ext4 makes a direct write not aligned to its block (4 KiB) wait for every direct I/O in flight
// on the file.
uint64_t end_align(const DirectFile& f) { return std::max<uint64_t>(f.offset_align, kPage); }

}  // namespace

uint32_t swap_job_tag() {
  uint32_t tag = 0;
  ssize_t got;
  while ((got = ::getrandom(&tag, sizeof tag, 0)) < 0 && errno == EINTR) {
  }
  // Without getrandom (ENOSYS) the clock still tells two containers' jobs apart.
  if (got != static_cast<ssize_t>(sizeof tag))
    tag = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count() * 0x9e3779b97f4a7c15ull >> 32);
  return tag;
}

std::string swap_job_name(int64_t pid, uint32_t tag) { return fmt::format("{}-{:08x}", pid, tag); }

Result<uint64_t> NvmeStore::dead_jobs_bytes(const std::string& nvme_path, NvmeEnv* env) {
  env = env ? env : NvmeEnv::Default();
  bool was_link = false;
  Result<std::string> real = env->resolve(nvme_path, &was_link);
  Result<Dir> parent = real.ok() ? env->open_dir(*real) : Result<Dir>(real.status());
  if (!parent.ok()) return uint64_t{0};  // no such directory yet: nothing left behind
  DirHolder p(env, std::move(parent).value());
  uint64_t bytes = 0;
  for_each_dead_job(env, p.get(), "", [&](const Dir& d, const std::string&, const std::vector<std::string>& files) {
    for (const std::string& f : files) {
      Result<EntryInfo> e = swap_name(f) ? env->stat_at(d, f) : Result<EntryInfo>(EntryInfo{});
      if (e.ok() && e->kind == EntryInfo::Kind::kFile) bytes += e->bytes;
    }
  });
  return bytes;
}

Result<std::unique_ptr<NvmeStore>> NvmeStore::open(const NvmeStoreOptions& o, std::span<const RegionSpec> regions) {
  if (o.nvme_path.empty()) return Status::Invalid("NVMe store: nvme_path is empty");
  if (!plain_name(o.job))
    return Status::Invalid("NVMe store: job name '" + o.job + "' must be letters, digits, '_', '-' or '.'");
  if (o.rank < 0) return Status::Invalid("NVMe store: negative rank");
  if (o.block_size < kPage || o.block_size % kPage != 0 || o.block_size > (uint32_t{1} << 30))
    return Status::Invalid(fmt::format("aio.block_size {}: expected a multiple of 4096 up to 1 GiB", o.block_size));
  if (o.queue_depth < 1 || o.queue_depth > 4096)
    return Status::Invalid(fmt::format("aio.queue_depth {}: expected 1 to 4096", o.queue_depth));

  std::unique_ptr<NvmeStore> st(new NvmeStore());
  st->o_ = o;
  st->env_ = o.env ? o.env : NvmeEnv::Default();
  NvmeEnv* env = st->env_;
  ZOE_ASSIGN_OR_RETURN(Dir parent, open_nvme_path(env, o.nvme_path));
  st->parent_ = std::move(parent);
  st->closed_ = false;  // from here on the destructor cleans up
  st->dir_name_ = "zoe-" + o.job + "-rank" + std::to_string(o.rank);
  remove_dead_jobs(env, st->parent_, st->dir_name_);
  // Made and registered for a signal's cleanup in one step (SignalExit::add_made).
  auto make = [&]() -> Result<std::function<void()>> {
    Result<Dir> dir = open_job_dir(env, st->parent_, st->dir_name_);
    if (!dir.ok()) return dir.status();  // someone else's: the destructor leaves it alone
    st->dir_ = std::move(dir).value();
    return std::function<void()>(
        [d = st->dir_.fd, p = st->parent_.fd, name = st->dir_name_] { remove_store_files(d, p, name); });
  };
  ZOE_ASSIGN_OR_RETURN(st->on_signal_, SignalCleanup::Made(make));

  const unsigned bounce = o.bounce_buffers ? o.bounce_buffers : o.queue_depth;
  if (o.pool) {
    st->pool_ = o.pool;
  } else {
    PinnedPoolOptions po;
    po.bytes = uint64_t{bounce} * o.block_size;
    po.pin = o.pin_memory;
    po.ledger = o.ledger;
    ZOE_ASSIGN_OR_RETURN(st->own_pool_, PinnedPool::create(po));
    st->pool_ = st->own_pool_.get();
  }
  for (unsigned i = 0; i < bounce; ++i) {
    ZOE_ASSIGN_OR_RETURN(PinnedPool::Lease lease, st->pool_->try_acquire(o.block_size));
    if (!lease)
      return Status::Invalid(fmt::format("NVMe store {}: the pinned pool has {} free, not enough for {} bounce buffers "
                                         "of aio.block_size {} (make the pool larger or bounce_buffers smaller)",
                                         st->dir_.path, bytes_text(st->pool_->available()), bounce, o.block_size));
    st->bounce_.push_back(std::move(lease));
  }

  ZOE_ASSIGN_OR_RETURN(st->queue_, env->new_queue(o.queue_depth));
  IoWorkerParams wp;
  wp.queue = st->queue_.get();
  wp.block_bytes = o.block_size;
  wp.registered = st->pool_->pinned() ? st->pool_ : nullptr;
  for (auto& b : st->bounce_) wp.bounce.push_back(b.data());
  st->worker_ = std::make_unique<IoWorker>(std::move(wp));  // from here on the queue is its thread's
  if (st->pool_->pinned()) {
    const std::vector<iovec> pieces = st->pool_->pieces();
    ZOE_RETURN_IF_ERROR(st->worker_->call([&](IoQueue& q) { return q.register_buffers(pieces); }));
  }

  ZOE_RETURN_IF_ERROR(st->add_regions(regions));
  return st;
}

NvmeStore::~NvmeStore() { (void)close(); }

Status NvmeStore::check_space(std::span<const RegionSpec> regions, uint64_t align) {
  uint64_t need = 0;
  std::string what;
  for (const RegionSpec& r : regions) {
    need += round_up<uint64_t>(r.bytes, align);
    what += fmt::format("{}{} {}", what.empty() ? "" : ", ", r.name, bytes_text(r.bytes));
  }
  ZOE_ASSIGN_OR_RETURN(uint64_t free, env_->free_bytes(dir_));
  if (need > free)
    return Status::Invalid(fmt::format("NVMe store {}: needs {} ({}), free {} on that file system; nothing was "
                                       "written: free space or point nvme_path elsewhere",
                                       dir_.path, bytes_text(need), what, bytes_text(free)));
  return Status::Ok();
}

Status NvmeStore::add_regions(std::span<const RegionSpec> regions) {
  if (closed_) return Status::Runtime("NVMe store: add_regions after close");
  for (size_t i = 0; i < regions.size(); ++i) {
    const RegionSpec& r = regions[i];
    if (!plain_name(r.name))
      return Status::Invalid("NVMe store: region name '" + r.name + "' must be letters, digits, '_', '-' or '.'");
    if (r.bytes == 0) return Status::Invalid("NVMe store: region '" + r.name + "' is empty");
    for (size_t k = 0; k < r.segment_ends.size(); ++k) {
      const uint64_t e = r.segment_ends[k];
      // The next segment begins on a block: two ends never share one, and they ascend.
      if (e > r.bytes || (k > 0 && e / o_.block_size <= (r.segment_ends[k - 1] - 1) / o_.block_size))
        return Status::Invalid(fmt::format("NVMe store: region '{}': segment end {} is past the region's {} bytes, "
                                           "or not in a later block than the one before", r.name, e, r.bytes));
    }
    bool dup = region(r.name).ok();
    for (size_t j = 0; j < i; ++j) dup = dup || regions[j].name == r.name;
    if (dup) return Status::Invalid("NVMe store: region '" + r.name + "' added twice");
  }
  ZOE_RETURN_IF_ERROR(check_space(regions, kPage));

  const size_t first_new = regions_.size();
  Status s;
  for (const RegionSpec& spec : regions) {
    auto rf = std::make_unique<RegionFile>(RegionFile{spec.name, dir_.at(file_name(spec.name)), {}, -1, spec.bytes,
                                                      0, BlockTable(0, o_.block_size, false)});
    Result<DirectFile> f = env_->create_direct_at(dir_, file_name(spec.name));
    if (!f.ok()) {
      s = f.status();
      break;
    }
    rf->file = f.value();
    regions_.push_back(std::move(rf));  // from here on close() removes it
    RegionFile& r = *regions_.back();
    if (o_.block_size % r.file.offset_align != 0 || r.file.mem_align > PinnedPool::kAlign) {
      s = Status::Invalid(fmt::format("{}: direct I/O there needs offsets aligned to {} and memory to {}; "
                                      "aio.block_size {} and the pool's {}-byte pages do not fit that",
                                      r.path, r.file.offset_align, r.file.mem_align, o_.block_size, PinnedPool::kAlign));
      break;
    }
    r.file_bytes = round_up<uint64_t>(r.bytes, r.file.offset_align);
    r.blocks = BlockTable(r.file_bytes, o_.block_size, o_.checksums, spec.segment_ends, end_align(r.file));
    if (!(s = env_->allocate(r.file.fd, r.path, r.file_bytes)).ok()) break;
    s = worker_->call([&](IoQueue& q) -> Status {
      ZOE_ASSIGN_OR_RETURN(r.queue_file, q.add_file(r.file.fd));
      return Status::Ok();
    });
    if (!s.ok()) {
      s = Status::Io(r.path + ": " + s.message());
      break;
    }
  }
  if (s.ok()) return s;
  // All or nothing: remove what this call made.
  while (regions_.size() > first_new) {
    RegionFile& r = *regions_.back();
    if (r.queue_file >= 0) (void)worker_->call([&](IoQueue& q) { return q.remove_file(r.queue_file); });
    env_->close_fd(r.file.fd);
    (void)env_->remove_file_at(dir_, file_name(r.name));
    regions_.pop_back();
  }
  return s;
}

Result<int> NvmeStore::region(std::string_view name) const {
  for (size_t i = 0; i < regions_.size(); ++i)
    if (regions_[i]->name == name) return static_cast<int>(i);
  return Status::Invalid(fmt::format("NVMe store {}: no region '{}'", dir_.path, name));
}

namespace {
// A read's sums also say which blocks have one to check.
bool caller_sums_fit(IoOp op, const BlockSums& s, WholeBlocks w) {
  return s.first == w.first && s.sums.size() == w.count && (op == IoOp::kWrite || s.check.size() == w.count);
}
}  // namespace

Ticket NvmeStore::read_async(int region, uint64_t offset, void* dst, uint64_t bytes, const TransferOptions& o) {
  return submit(IoOp::kRead, region, offset, static_cast<uint8_t*>(dst), bytes, o);
}

Ticket NvmeStore::write_async(int region, uint64_t offset, const void* src, uint64_t bytes, const TransferOptions& o) {
  // The I/O thread only reads from a write's memory.
  return submit(IoOp::kWrite, region, offset, const_cast<uint8_t*>(static_cast<const uint8_t*>(src)), bytes, o);
}

uint64_t NvmeStore::segment_end_align(int region) const { return end_align(regions_[region]->file); }

WholeBlocks NvmeStore::caller_blocks(int region, uint64_t offset, uint64_t bytes) const {
  return regions_[region]->blocks.whole(offset, bytes);
}

Status NvmeStore::check_sum(int region, uint64_t block, uint64_t recorded, uint64_t got) const {
  if (got == recorded) return Status::Ok();
  const RegionFile& r = *regions_[region];
  return Status::Corrupt(checksum_mismatch(r.path, block, r.blocks.begin(block), r.blocks.end(block), recorded, got));
}

Ticket NvmeStore::submit(IoOp op, int region, uint64_t offset, uint8_t* user, uint64_t bytes,
                         const TransferOptions& o) {
  const std::shared_ptr<BlockSums>& sums = o.sums;
  Ticket ticket;
  ticket.t_ = std::make_shared<Transfer>();
  Transfer& t = *ticket.t_;
  t.op = op;
  t.offset = offset;
  t.user = user;
  t.bytes = bytes;
  t.background = o.background;
  t.pad_last_block = op == IoOp::kWrite && o.pad_last_block;
  t.landed = o.landed;
  if (closed_) {
    t.status = Status::Runtime(fmt::format("NVMe store {}: {} after close", dir_.path, io_op_name(op)));
  } else if (region < 0 || region >= regions()) {
    t.status = Status::Invalid(fmt::format("NVMe store {}: no region {}", dir_.path, region));
  } else if (offset > regions_[region]->bytes || bytes > regions_[region]->bytes - offset) {
    t.status = Status::Invalid(fmt::format("{}: {} of {} bytes at offset {} is past the end of region '{}' ({} bytes)",
                                           regions_[region]->path, io_op_name(op), bytes, offset,
                                           regions_[region]->name, regions_[region]->bytes));
  } else if (!regions_[region]->blocks.in_blocks(offset, bytes)) {
    t.status = Status::Invalid(fmt::format("{}: {} of {} bytes at offset {} reaches past the end of a segment of "
                                           "region '{}' into its padding", regions_[region]->path, io_op_name(op),
                                           bytes, offset, regions_[region]->name));
  } else if (bytes > 0 && user == nullptr) {
    t.status = Status::Invalid(fmt::format("{}: {} with a null buffer", regions_[region]->path, io_op_name(op)));
  } else if (sums && !caller_sums_fit(op, *sums, caller_blocks(region, offset, bytes))) {
    t.status = Status::Invalid(fmt::format("{}: {} of {} bytes at offset {}: the caller's block sums do not cover "
                                           "its whole blocks", regions_[region]->path, io_op_name(op), bytes, offset));
  } else {
    t.region = regions_[region].get();
    if (o_.checksums) t.caller_sums = sums;
    worker_->submit(ticket.t_);
    return ticket;
  }
  t.done = true;
  return ticket;
}


void NvmeStore::wait_idle() {
  if (worker_) worker_->wait_idle();
}

NvmeStore::Traffic NvmeStore::traffic() const {
  return worker_ ? Traffic{worker_->device_read_bytes(), worker_->device_written_bytes(), worker_->hashed_bytes(),
                         worker_->forwarded_bytes(), worker_->zero_filled_bytes()}
                 : Traffic{};
}

bool NvmeStore::ready(const Ticket& t) const {
  if (!t.t_ || t.t_->region == nullptr || !worker_) return true;
  return worker_->done(*t.t_);
}

Status NvmeStore::wait(const Ticket& t) {
  if (!t.t_) return Status::Invalid("NVMe store: waiting on an empty ticket");
  if (t.t_->region == nullptr) return t.t_->status;  // refused at submission, never queued
  return worker_ ? worker_->wait(*t.t_) : t.t_->status;
}

Status NvmeStore::close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  on_signal_.reset();  // from here on close() removes the files; the descriptors will go
  if (worker_) worker_->stop();  // every transfer submitted completes first
  // Bounce buffers the kernel may still write into (requests abandoned after the queue failed)
  // never go back to the pool (a pool of the store's own is unmapped below, but the kernel keeps
  // the pages it pinned for a request until the request is done).
  if (worker_)
    for (int i : worker_->abandoned_bounce()) bounce_[i].leak();
  worker_.reset();
  Status first;
  auto keep = [&](Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  queue_.reset();  // the ring holds the files' registrations
  for (auto& r : regions_) {
    env_->close_fd(r->file.fd);
    keep(env_->remove_file_at(dir_, file_name(r->name)));
  }
  regions_.clear();
  bounce_.clear();
  own_pool_.reset();
  if (dir_.fd >= 0) {
    // The marker first: a cleanup that finds the directory unlocked from here on leaves it alone.
    keep(env_->remove_file_at(dir_, kMarker));
    keep(env_->remove_dir_at(parent_, dir_name_));
  }
  env_->close_fd(dir_.fd);  // the lock goes last: nobody can take the directory while files remain
  dir_.fd = -1;
  env_->close_fd(parent_.fd);
  parent_.fd = -1;
  return first;
}

}  // namespace zoe

#include "ckpt/atomic_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "common/posix_io.h"

namespace fs = std::filesystem;

namespace zoe {

namespace {

std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// fsyncs every regular file and directory under `dir`, then `dir` itself. Symlinks are not followed.
Status sync_tree(const std::string& dir) {
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) return Status::Io(dir + ": cannot list: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) return Status::Io(dir + ": cannot list: " + ec.message());
    const fs::directory_entry& e = *it;
    std::string p = e.path().string();
    if (e.is_symlink(ec)) continue;
    if (e.is_directory(ec)) {
      ZOE_RETURN_IF_ERROR(fsync_dir(p));
    } else if (e.is_regular_file(ec)) {
      int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return open_error(p, "open for fsync", errno);
      Status s = fsync_fd(fd, p);
      ::close(fd);
      ZOE_RETURN_IF_ERROR(s);
    }
  }
  if (ec) return Status::Io(dir + ": cannot list: " + ec.message());
  return fsync_dir(dir);
}

Status remove_tree(const std::string& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) return Status::Io(p + ": cannot remove: " + ec.message());
  return Status::Ok();
}

// Kind of `p` without following a final symlink: 0 absent, 1 directory, 2 something else.
Result<int> path_kind(const std::string& p) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    return open_error(p, "stat", errno);
  }
  return S_ISDIR(st.st_mode) ? 1 : 2;
}

Status rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int e = errno;
    return Status::Io("cannot rename " + from + " to " + to + ": " + errno_string(e));
  }
  return Status::Ok();
}

// True when `name` is `base` + ".tmp." or ".old." + digits; *is_old tells which.
bool is_leftover(const std::string& name, const std::string& base, bool* is_old) {
  if (name.size() <= base.size() + 5 || name.compare(0, base.size(), base) != 0) return false;
  std::string rest = name.substr(base.size());
  if (rest.compare(0, 5, ".tmp.") == 0) {
    *is_old = false;
  } else if (rest.compare(0, 5, ".old.") == 0) {
    *is_old = true;
  } else {
    return false;
  }
  for (size_t i = 5; i < rest.size(); ++i)
    if (rest[i] < '0' || rest[i] > '9') return false;
  return true;
}

}  // namespace

Result<AtomicDir> AtomicDir::Create(const std::string& final_path, Options opt) {
  std::string fin = strip_trailing_slashes(final_path);
  if (fin.empty() || fin == "/" || base_name(fin) == "." || base_name(fin) == "..")
    return Status::Invalid("'" + final_path + "': not a directory name that can be replaced");
  std::string parent = parent_dir(fin);
  ZOE_RETURN_IF_ERROR(make_private_dirs(parent));
  ZOE_RETURN_IF_ERROR(Recover(fin));
  AtomicDir d;
  d.final_ = fin;
  d.tmp_ = fin + ".tmp." + std::to_string(::getpid());
  d.opt_ = std::move(opt);
  ZOE_RETURN_IF_ERROR(remove_tree(d.tmp_));
  // A signal that ends the `zoe` command abandons the save: the half-written directory goes. (After
  // an exchange it holds the old checkpoint, which step 3 removes anyway; between the two renames
  // of 2b Recover() puts the old one back.) Made and registered in one step (SignalExit::add_made).
  // The writers may still be adding files meanwhile (the signal thread runs beside them), so the
  // removal is retried until the directory is gone (half a second at most).
  auto make = [&d]() -> Result<std::function<void()>> {
    if (::mkdir(d.tmp_.c_str(), 0700) != 0) return open_error(d.tmp_, "create directory", errno);
    d.open_ = true;
    // The whole model and its optimizer state go in here: its owner's alone, whatever the umask.
    if (::chmod(d.tmp_.c_str(), 0700) != 0) return open_error(d.tmp_, "set mode 0700 on", errno);
    return std::function<void()>([tmp = d.tmp_] {
      for (int i = 0; i < 100; ++i) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        if (!fs::exists(fs::symlink_status(tmp, ec))) return;
        ::usleep(5000);
      }
    });
  };
  ZOE_ASSIGN_OR_RETURN(d.on_signal_, SignalCleanup::Made(make));
  return d;
}

AtomicDir::AtomicDir(AtomicDir&& o) noexcept { *this = std::move(o); }

AtomicDir& AtomicDir::operator=(AtomicDir&& o) noexcept {
  if (this == &o) return *this;
  abort();
  final_ = std::move(o.final_);
  tmp_ = std::move(o.tmp_);
  opt_ = std::move(o.opt_);
  open_ = std::exchange(o.open_, false);
  on_signal_ = std::move(o.on_signal_);
  return *this;
}

AtomicDir::~AtomicDir() { abort(); }

void AtomicDir::abort() {
  on_signal_.reset();
  if (!open_) return;
  open_ = false;
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // best effort; a leftover is removed by the next Recover()
}

void AtomicDir::step(Step s) const {
  if (opt_.after_step) opt_.after_step(s);
}

Status AtomicDir::commit() {
  if (!open_) return Status::Runtime(final_ + ": commit of a closed AtomicDir");
  const std::string parent = parent_dir(final_);
  Status s = sync_tree(tmp_);
  if (!s.ok()) {
    abort();
    return s;
  }
  step(Step::kSynced);
  Result<int> kind = path_kind(final_);
  if (!kind.ok()) {
    abort();
    return kind.status();
  }
  if (kind.value() == 2) {
    abort();
    return Status::Invalid(final_ + ": exists and is not a directory; refusing to replace it");
  }
  std::string old;  // where the previous directory ends up, if any
  if (kind.value() == 0) {
    s = rename_path(tmp_, final_);
    if (!s.ok()) {
      abort();
      return s;
    }
  } else {
    bool exchanged = false;
    if (opt_.use_exchange) {
      if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) == 0) {
        exchanged = true;
        old = tmp_;
      } else if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        int e = errno;
        abort();
        return Status::Io("cannot exchange " + tmp_ + " with " + final_ + ": " + errno_string(e));
      }
    }
    if (!exchanged) {
      old = final_ + ".old." + std::to_string(::getpid());
      s = remove_tree(old);
      if (s.ok()) s = rename_path(final_, old);
      if (!s.ok()) {
        abort();
        return s;
      }
      s = fsync_dir(parent);
      if (!s.ok()) {
        (void)rename_path(old, final_);
        abort();
        return s;
      }
      step(Step::kOldMovedAside);
      s = rename_path(tmp_, final_);
      if (!s.ok()) {
        // Put the old directory back; if even that fails, Recover() will.
        (void)rename_path(old, final_);
        abort();
        return s;
      }
    }
  }
  open_ = false;
  on_signal_.reset();  // the new directory is in place: a signal from here on keeps it
  ZOE_RETURN_IF_ERROR(fsync_dir(parent));
  step(Step::kNewInPlace);
  if (!old.empty()) {
    ZOE_RETURN_IF_ERROR(remove_tree(old));
    ZOE_RETURN_IF_ERROR(fsync_dir(parent));
    step(Step::kOldRemoved);
  }
  return Status::Ok();
}

Status AtomicDir::Recover(const std::string& final_path) {
  std::string fin = strip_trailing_slashes(final_path);
  std::string parent = parent_dir(fin), base = base_name(fin);
  std::error_code ec;
  fs::directory_iterator it(parent, ec), end;
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return Status::Ok();
    return Status::Io(parent + ": cannot list: " + ec.message());
  }
  std::vector<std::string> tmps, olds;
  for (; it != end; it.increment(ec)) {
    if (ec) return Status::Io(parent + ": cannot list: " + ec.message());
    bool is_old = false;
    std::string name = it->path().filename().string();
    if (!is_leftover(name, base, &is_old)) continue;
    (is_old ? olds : tmps).push_back(it->path().string());
  }
  if (ec) return Status::Io(parent + ": cannot list: " + ec.message());
  ZOE_ASSIGN_OR_RETURN(int kind, path_kind(fin));
  bool changed = false;
  if (kind == 0 && !olds.empty()) {
    if (olds.size() > 1) {
      std::string list;
      for (const auto& o : olds) list += " " + o;
      return Status::Corrupt(fin + " is missing and several earlier versions exist (" +
                             list.substr(1) + "); keep the right one under " + fin +
                             " by hand");
    }
    ZOE_RETURN_IF_ERROR(rename_path(olds[0], fin));
    olds.clear();
    changed = true;
  }
  for (const auto& p : tmps) ZOE_RETURN_IF_ERROR(remove_tree(p));
  for (const auto& p : olds) ZOE_RETURN_IF_ERROR(remove_tree(p));
  if (changed || !tmps.empty() || !olds.empty()) return fsync_dir(parent);
  return Status::Ok();
}

}  // namespace zoe

// Crash-safe creation or replacement of a whole directory (a checkpoint).
//
// Create() makes an empty "<final>.tmp.<pid>" (removing a stale one); the caller fills path().
// commit():
//   1. fsyncs every file and directory under the temporary directory       -> Step::kSynced
//   2a. exchange mode (renameat2 RENAME_EXCHANGE, when the file system has it and <final>
//       exists): atomically swaps the two names, so <final> is the new directory and the
//       temporary name holds the old one                                  -> Step::kNewInPlace
//   2b. otherwise: renames an existing <final> to "<final>.old.<pid>"       -> Step::kOldMovedAside
//       then renames the temporary directory to <final>                    -> Step::kNewInPlace
//   3. removes the old directory                                          -> Step::kOldRemoved
// The parent directory is fsynced after each rename.
//
// What a crash leaves:
//   before 2 (while filling, or syncing): <final> unchanged (old or absent); an incomplete
//     "<final>.tmp.<pid>".
//   2a done: <final> complete and new; the old one under "<final>.tmp.<pid>".
//   between the two renames of 2b: no <final>; the old one, complete, as "<final>.old.<pid>";
//     the new one, complete, as "<final>.tmp.<pid>". Recover() renames the old one back.
//   2b done: <final> complete and new; the old one (whole or partly removed) as "<final>.old.<pid>".
// So a directory under the name <final> is always a complete, fsynced one: it only ever gets that
// name by a rename after step 1. Readers take only directories named exactly as a checkpoint
// (never "*.tmp.<n>" or "*.old.<n>"), and the checkpoint layer additionally requires its
// manifest.json to exist and its checksums to verify, which catches storage that lost data.
//
// Recover(final) (also run by Create) puts such a leftover state right: when <final> is absent
// and exactly one "<final>.old.<n>" exists, renames it to <final>; then deletes every
// "<final>.tmp.<n>" and "<final>.old.<n>". It assumes no other process is writing <final>: in a
// multi-rank job one process owns the AtomicDir and the others write their files into its path()
// before it commits (commit() fsyncs their files too).
#pragma once
#include <functional>
#include <string>

#include "common/signal_exit.h"
#include "zoe/status.h"

namespace zoe {

class AtomicDir {
 public:
  enum class Step { kSynced, kOldMovedAside, kNewInPlace, kOldRemoved };
  struct Options {
    bool use_exchange = true;                 // false: always the two-rename sequence 2b
    std::function<void(Step)> after_step;     // for tests that simulate a crash at each step
  };

  // Creates missing parent directories of `final_path`.
  static Result<AtomicDir> Create(const std::string& final_path, Options opt);
  static Result<AtomicDir> Create(const std::string& final_path) { return Create(final_path, {}); }

  AtomicDir(AtomicDir&& o) noexcept;
  AtomicDir& operator=(AtomicDir&& o) noexcept;
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;
  ~AtomicDir();  // abort() unless committed

  const std::string& path() const { return tmp_; }  // the temporary directory to fill
  const std::string& final_path() const { return final_; }

  Status commit();
  void abort();  // removes the temporary directory

  static Status Recover(const std::string& final_path);

 private:
  AtomicDir() = default;
  void step(Step s) const;

  std::string final_;
  std::string tmp_;
  Options opt_;
  bool open_ = false;
  SignalCleanup on_signal_;  // removes tmp_ if a signal ends the process mid-save
};

}  // namespace zoe

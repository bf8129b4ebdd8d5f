// How the `zoe` command ends on a signal: the way an error ends it, not with files left behind.
//
// SignalExit::Install() (main(), for the commands that write files) handles SIGINT, SIGTERM,
// SIGHUP and SIGPIPE (its output's reader gone) on whichever thread they land: the handler passes the first through a pipe to a thread of
// its own, which
//   1. prints one line naming the signal,
//   2. runs every cleanup registered (newest first): a swap directory, a checkpoint save in progress,
//   3. ends the process with exit 128 + the signal's number (130 for SIGINT, 143 for SIGTERM);
// a second of those signals meanwhile kills the process at once (their default action);
// a lock zoe holds goes with the process. It also catches SIGBUS in a mapping of a file that
// shrank while zoe read it (MappedFile): one line naming the file, the same cleanup, exit 1.
// A library user (the C API, Python) owns the process's signals: nothing is installed there, and
// registering cleanups costs a mutex and does nothing else.
#pragma once
#include <cstdint>
#include <functional>

#include "zoe/status.h"

namespace zoe {

class SignalExit {
 public:
  static void Install();
  static bool installed();
  // The process has printed why it ends (an error) and is on its way out: a signal now (mpirun's
  // SIGTERM to the ranks still exiting) still cleans up, without a line of its own.
  static void ending();

  // Work to do if a signal ends the process: remove what only this job could use. Thread-safe.
  static uint64_t add(std::function<void()> cleanup);
  // make() creates what a signal must undo and returns the undoing, registered in the same step
  // against a signal's cleanups: they run either after both (this one among them) or before make()
  // would start (which then does not run: kRuntime, the process is ending). A directory created
  // and then registered was left behind when the signal's cleanups ran in between (a checkpoint
  // save's under a loaded disk). make() must not add or remove cleanups itself; its error is returned as it is.
  static Result<uint64_t> add_made(const std::function<Result<std::function<void()>>()>& make);
  static void remove(uint64_t id);
  // Runs every registered cleanup, newest first, and forgets them (the signal thread's step 3).
  static void run_cleanups();
};

// A cleanup registered for as long as this object lives (moves keep it; destruction removes it).
class SignalCleanup {
 public:
  SignalCleanup() = default;
  explicit SignalCleanup(std::function<void()> cleanup) : id_(SignalExit::add(std::move(cleanup))) {}
  // SignalExit::add_made's, held by this object.
  static Result<SignalCleanup> Made(const std::function<Result<std::function<void()>>()>& make) {
    ZOE_ASSIGN_OR_RETURN(uint64_t id, SignalExit::add_made(make));
    SignalCleanup c;
    c.id_ = id;
    return c;
  }
  SignalCleanup(SignalCleanup&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  SignalCleanup& operator=(SignalCleanup&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = 0;
    }
    return *this;
  }
  SignalCleanup(const SignalCleanup&) = delete;
  SignalCleanup& operator=(const SignalCleanup&) = delete;
  ~SignalCleanup() { reset(); }
  void reset() {
    if (id_) SignalExit::remove(id_);
    id_ = 0;
  }

 private:
  uint64_t id_ = 0;
};

}  // namespace zoe

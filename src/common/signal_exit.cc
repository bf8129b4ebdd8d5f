#include "common/signal_exit.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "common/mapped_file.h"

namespace zoe {
namespace {

std::mutex g_mu;
std::map<uint64_t, std::function<void()>> g_cleanups;  // by id: newest last
uint64_t g_next_id = 1;
bool g_cleaned = false;  // run_cleanups has run: nothing made from here on is undone
std::atomic<bool> g_installed{false};
std::atomic<bool> g_ending{false};  // the process has said why it ends: a signal adds no line
std::atomic<int> g_first{0};  // the first ending signal (kBus for a SIGBUS in a mapped file)
int g_pipe[2] = {-1, -1};     // handler -> signal thread: whichever thread a signal lands on
constexpr int kBus = 1000;
// SIGPIPE too: a reader of zoe's output that went away (`zoe train | tee log` and Ctrl-C, a parent
// that died) must not end the job before its cleanups, as the default action does.
constexpr int kEnding[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    default: return "a signal";
  }
}

void die_of(int sig) {
  signal(sig, SIG_DFL);
  raise(sig);
}

// Async-signal-safe, on whatever thread the signal lands (a library's threads included): passes
// the first signal to the signal thread; a second one kills at once.
void on_ending(int sig) {
  int none = 0;
  if (!g_first.compare_exchange_strong(none, sig)) die_of(sig);
  (void)!write(g_pipe[1], &sig, sizeof sig);
}

void on_bus(int sig, siginfo_t* info, void*) {
  char path[512], msg[768];
  if (!MappedFile::PathOfAddress(info->si_addr, path, sizeof path)) die_of(sig);  // a real fault
  size_t n = 0;
  for (const char* part : {"zoe: ", static_cast<const char*>(path),
                           ": the file shrank (truncated or rewritten) while zoe read it; stopping\n"})
    for (const char* c = part; *c && n < sizeof msg; ++c) msg[n++] = *c;
  (void)!write(STDERR_FILENO, msg, n);
  int none = 0;
  if (g_first.compare_exchange_strong(none, kBus)) {
    int code = kBus;
    (void)!write(g_pipe[1], &code, sizeof code);
  }
  for (;;) pause();  // this thread cannot go on: it would fault again
}

constexpr int kQuit = -1;  // the process is exiting normally: the thread ends

void wait_and_end() {
  int sig = 0;
  while (read(g_pipe[0], &sig, sizeof sig) != static_cast<ssize_t>(sizeof sig)) {
  }
  if (sig == kQuit) return;
  // The line below may go to a pipe nobody reads any more: it must fail, not end the process.
  signal(SIGPIPE, SIG_IGN);
  if (sig != kBus && !g_ending.load())
    std::fprintf(stderr, "zoe: %s: stopping; removing this job's swap files and any checkpoint save in progress "
                         "(send it again to kill at once)\n", signal_name(sig));
  SignalExit::run_cleanups();
  std::fflush(stderr);
  _exit(sig == kBus ? 1 : 128 + sig);
}

}  // namespace

void SignalExit::Install() {
  if (g_installed.exchange(true)) return;
  if (pipe2(g_pipe, O_CLOEXEC) != 0) return;  // no pipe: signals keep their default action
  // Joined when the process exits normally (static destruction), so that no thread outlives main.
  static struct Waiter {
    std::thread t{wait_and_end};
    ~Waiter() {
      int quit = kQuit;
      if (write(g_pipe[1], &quit, sizeof quit) == static_cast<ssize_t>(sizeof quit)) t.join();
      else t.detach();
    }
  } waiter;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_ending;
  sigemptyset(&sa.sa_mask);
  for (int k : kEnding) sigaction(k, &sa, nullptr);
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_bus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

bool SignalExit::installed() { return g_installed.load(); }

void SignalExit::ending() { g_ending.store(true); }

uint64_t SignalExit::add(std::function<void()> cleanup) {
  std::lock_guard<std::mutex> lock(g_mu);
  uint64_t id = g_next_id++;
  g_cleanups.emplace(id, std::move(cleanup));
  return id;
}

Result<uint64_t> SignalExit::add_made(const std::function<Result<std::function<void()>>()>& make) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_cleaned) return Status::Runtime("a signal is ending the process: nothing new is made");
  ZOE_ASSIGN_OR_RETURN(std::function<void()> cleanup, make());
  uint64_t id = g_next_id++;
  g_cleanups.emplace(id, std::move(cleanup));
  return id;
}

void SignalExit::remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cleanups.erase(id);
}

void SignalExit::run_cleanups() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cleaned = true;
  for (auto it = g_cleanups.rbegin(); it != g_cleanups.rend(); ++it) it->second();
  g_cleanups.clear();
}

}  // namespace zoe

#include "cpu/memory_fence.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zoe {
namespace {

// The guarded ranges, for the fault handler: a fixed table of atomics (a signal handler may not
// lock or allocate). Slots are claimed with compare-exchange and freed by the fence's destructor.
constexpr int kMaxFences = 64;
struct Guarded {
  std::atomic<char*> base{nullptr};
  std::atomic<size_t> bytes{0};
};
std::array<Guarded, kMaxFences> g_fences;
struct sigaction g_previous;
std::once_flag g_installed;

// Async-signal-safe: formats with snprintf into a stack buffer is not guaranteed safe, so the
// message is assembled by hand.
void append(char*& p, const char* s) {
  while (*s) *p++ = *s++;
}
void append_hex(char*& p, uintptr_t v) {
  append(p, "0x");
  char digits[2 * sizeof(v)];
  int n = 0;
  do {
    digits[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  while (n) *p++ = digits[--n];
}

void on_fault(int sig, siginfo_t* info, void* ctx) {
  auto addr = reinterpret_cast<char*>(info->si_addr);
  for (Guarded& g : g_fences) {
    char* b = g.base.load();
    if (b && addr >= b && addr < b + g.bytes.load()) {
      char msg[256], *p = msg;
      append(p, "zoe: cpu-strict: host code touched device memory at ");
      append_hex(p, reinterpret_cast<uintptr_t>(addr));
      append(p, " (offset ");
      append_hex(p, static_cast<uintptr_t>(addr - b));
      append(p, " of the device arena) outside a Device call\n");
      (void)!write(STDERR_FILENO, msg, p - msg);
      break;
    }
  }
  // Whatever it was, the previous disposition decides (the default: die with SIGSEGV).
  sigaction(SIGSEGV, &g_previous, nullptr);
  if (!(g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN)
    g_previous.sa_handler(sig);
  else if (g_previous.sa_flags & SA_SIGINFO)
    g_previous.sa_sigaction(sig, info, ctx);
}

void install_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous);
}

}  // namespace

MemoryFence::MemoryFence(void* base, size_t bytes) : base_(static_cast<char*>(base)), bytes_(base ? bytes : 0) {
  if (bytes_ == 0) return;
  std::call_once(g_installed, install_handler);
  for (Guarded& g : g_fences) {
    char* expected = nullptr;
    if (g.base.compare_exchange_strong(expected, base_)) {
      g.bytes.store(bytes_);
      break;
    }
  }
  protect(PROT_NONE);
}

MemoryFence::~MemoryFence() {
  if (bytes_ == 0) return;
  for (Guarded& g : g_fences)
    if (g.base.load() == base_) {
      g.bytes.store(0);
      g.base.store(nullptr);
    }
  protect(PROT_READ | PROT_WRITE);  // the owner unmaps it next
}

void MemoryFence::protect(int prot) {
  if (mprotect(base_, bytes_, prot) != 0) {
    std::fprintf(stderr, "zoe: cpu-strict: mprotect of the device arena failed: %s\n", std::strerror(errno));
    std::abort();
  }
}

void MemoryFence::open() {
  if (bytes_ == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  if (depth_++ == 0) protect(PROT_READ | PROT_WRITE);
}

void MemoryFence::close() {
  if (bytes_ == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  if (--depth_ == 0) protect(PROT_NONE);
}

}  // namespace zoe

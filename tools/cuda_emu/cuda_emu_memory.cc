// Where memory lives, for the emulation's checks: device memory (cudaMalloc: whole pages,
// NaN-filled, closed to host code outside operations), pinned host memory (cudaHostAlloc,
// cudaHostRegister), and the blocks an allocator hands out of them (cuda_emu_note_block).
#include "cuda_emu_internal.h"  // first: cuda_emu.h defines the CUDA qualifiers before the CUDA headers do

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string>

namespace {

struct Alloc {
  size_t bytes, mapped;
};
// Never destroyed: stream workers may still look things up while the process exits.
std::mutex& g_mu = *new std::mutex;                          // everything below
std::map<char*, Alloc>& g_device = *new std::map<char*, Alloc>;  // cudaMalloc: base -> sizes
std::map<char*, size_t>& g_pinned = *new std::map<char*, size_t>;  // cudaHostAlloc / cudaHostRegister
std::map<char*, size_t>& g_blocks = *new std::map<char*, size_t>;  // an allocator's blocks in use
int g_open = 0;                                                  // open_device_memory depth

void protect_all(int prot) {
  for (auto& [p, a] : g_device)
    if (mprotect(p, a.mapped, prot) != 0) emu::die("mprotect of device memory failed");
}

// The entry of `m` whose [base, base + size(entry)) holds p, or m.end().
template <class M, class Size>
typename M::const_iterator holder(const M& m, const void* p, Size size) {
  auto* c = const_cast<char*>(static_cast<const char*>(p));
  auto it = m.upper_bound(c);
  if (it == m.begin()) return m.end();
  --it;
  return c < it->first + size(it->second) ? it : m.end();
}
size_t mapped_of(const Alloc& a) { return a.mapped; }
size_t bytes_of(const size_t& n) { return n; }

void on_segv(int, siginfo_t* si, void*) {
  // No lock in a signal handler: a racing cudaMalloc may make this miss, never crash (maps only
  // grow under the lock, and this only reads).
  auto it = holder(g_device, si->si_addr, mapped_of);
  if (it != g_device.end()) {
    char msg[200];
    const int n = std::snprintf(msg, sizeof msg,
                                "cuda_emu: host code touched device memory at %p (byte %zu of a cudaMalloc of %zu)\n",
                                si->si_addr, static_cast<size_t>(static_cast<char*>(si->si_addr) - it->first),
                                it->second.bytes);
    (void)!write(2, msg, n);
  }
  signal(SIGSEGV, SIG_DFL);  // the fault repeats and ends the process with its usual report
}

[[maybe_unused]] const bool g_segv_handler = [] {
  struct sigaction sa{};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  return true;
}();

// Drops pinned memory at p from the registry (false when it is not there), after checking that no
// queued work the host has not synchronized with still uses it.
bool forget_pinned(const char* call, void* p) {
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_pinned.find(static_cast<char*>(p));
    if (it == g_pinned.end()) return false;
    bytes = it->second;
  }
  emu::check_unused(call, p, bytes);
  std::lock_guard<std::mutex> lock(g_mu);
  g_pinned.erase(static_cast<char*>(p));
  return true;
}

}  // namespace

namespace emu {

// Only the pages an operation uses open (the rest of their allocations, and the other
// allocations, stay closed to host code meanwhile), unless it names none it can be held to (a
// kernel with a struct argument: kAllMemory). Pages, not whole allocations: mprotect's cost is
// per page, and opening and closing a caching allocator's arena of hundreds of MiB around each
// small copy took 7 % of an emulated engine test's time. Operations run one at a time (exclusive()).
std::vector<OpenedSpan> open_device_memory(const std::vector<Range>& uses) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<OpenedSpan> opened;
  bool all = false;
  for (const Range& r : uses) all |= r.p == nullptr;
  for (auto& [p, a] : g_device) {
    if (all) {
      if (mprotect(p, a.mapped, PROT_READ | PROT_WRITE) != 0) emu::die("mprotect of device memory failed");
      opened.push_back({p, a.mapped});
      continue;
    }
    char* const base = p;  // (clang 14 captures no structured binding)
    const auto page = [base](const char* at) { return static_cast<size_t>(at - base) / 4096 * 4096; };
    for (const Range& u : uses) {
      if (!u.bytes || u.p >= base + a.mapped || base >= u.p + u.bytes) continue;
      const size_t from = u.p > base ? page(u.p) : 0;
      const size_t to = std::min(a.mapped, page(std::min<const char*>(u.p + u.bytes, base + a.mapped) - 1) + 4096);
      if (mprotect(base + from, to - from, PROT_READ | PROT_WRITE) != 0) emu::die("mprotect of device memory failed");
      opened.push_back({base + from, to - from});
    }
  }
  if (all) g_open++;
  return opened;
}
void close_device_memory(const std::vector<OpenedSpan>& opened, bool all) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (all) g_open--;
  for (const OpenedSpan& o : opened)  // (the allocation may have gone meanwhile: then so have its pages)
    if (holder(g_device, o.p, mapped_of) != g_device.end() && mprotect(o.p, o.bytes, PROT_NONE) != 0)
      emu::die("mprotect of device memory failed");
  if (all && g_open == 0) protect_all(PROT_NONE);  // what was allocated meanwhile
}

std::vector<std::pair<const char*, const char*>> global_ranges() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::pair<const char*, const char*>> r;
  for (const auto& [p, a] : g_device) r.emplace_back(p, p + a.mapped);
  for (const auto& [p, n] : g_pinned) r.emplace_back(p, p + n);
  std::sort(r.begin(), r.end());
  return r;
}

Where where(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (holder(g_device, p, mapped_of) != g_device.end()) return Where::kDevice;
  if (holder(g_pinned, p, bytes_of) != g_pinned.end()) return Where::kPinned;
  return Where::kPageable;
}

Range block_of(const void* p, bool write) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto b = holder(g_blocks, p, bytes_of); b != g_blocks.end()) return {b->first, b->second, write};
  if (auto d = holder(g_device, p, mapped_of); d != g_device.end()) return {d->first, d->second.bytes, write};
  if (auto h = holder(g_pinned, p, bytes_of); h != g_pinned.end()) return {h->first, h->second, write};
  return {static_cast<const char*>(p), 0, write};
}

std::string describe(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto at = [&](const char* kind, const char* base, size_t bytes) {
    return std::string(kind) + " of " + std::to_string(bytes) + " bytes (byte " +
           std::to_string(static_cast<const char*>(p) - base) + ")";
  };
  if (auto b = holder(g_blocks, p, bytes_of); b != g_blocks.end()) return at("an allocator block", b->first, b->second);
  if (auto d = holder(g_device, p, mapped_of); d != g_device.end()) return at("a cudaMalloc", d->first, d->second.bytes);
  if (auto h = holder(g_pinned, p, bytes_of); h != g_pinned.end()) return at("pinned host memory", h->first, h->second);
  return "host memory";
}

}  // namespace emu

size_t emu::total_global_mem() {
  static const size_t total = [] {
    const char* v = std::getenv("CUDA_EMU_MEMORY");
    if (!v || !*v) return size_t{1} << 34;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*end || n == 0) emu::die(std::string("CUDA_EMU_MEMORY must be a number of bytes, not \"") + v + "\"");
    return static_cast<size_t>(n);
  }();
  return total;
}

extern "C" {

void cuda_emu_note_block(const void* p, size_t bytes, int in_use) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* c = const_cast<char*>(static_cast<const char*>(p));
  if (in_use) g_blocks[c] = bytes;
  else g_blocks.erase(c);
}

// Whole pages (so that they can be closed), NaN-filled: reading what was never written shows up.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (emu::injected("cudaMalloc")) return emu::fail(cudaErrorMemoryAllocation);
  const size_t mapped = (bytes + 256 + 4095) / 4096 * 4096;
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return emu::fail(cudaErrorMemoryAllocation);
  auto* f = static_cast<float*>(m);
  for (size_t i = 0; i < mapped / sizeof(float); i++) f[i] = std::numeric_limits<float>::quiet_NaN();
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_open == 0 && mprotect(m, mapped, PROT_NONE) != 0) emu::die("mprotect of device memory failed");
  g_device[static_cast<char*>(m)] = Alloc{bytes, mapped};
  *p = m;
  return cudaSuccess;
}

// Free: the emulated GPU's memory less what cudaMalloc holds (the runtime's own is not modelled).
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (emu::injected("cudaMemGetInfo")) return emu::fail(cudaErrorUnknown);
  std::lock_guard<std::mutex> lock(g_mu);
  size_t held = 0;
  for (const auto& [p, a] : g_device) held += a.mapped;
  *total = emu::total_global_mem();
  *free = held < *total ? *total - held : 0;
  return cudaSuccess;
}

// Stricter than CUDA, whose cudaFree waits for the device: memory queued work still uses is an
// error here, since zoe never frees that way on purpose (a caching allocator would not wait).
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  size_t mapped = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_device.find(static_cast<char*>(p));
    if (it == g_device.end()) return emu::fail(cudaErrorInvalidValue);
    mapped = it->second.mapped;
  }
  emu::check_unused("cudaFree", p, mapped);
  std::lock_guard<std::mutex> lock(g_mu);
  munmap(p, mapped);  // poisoned: a later touch faults
  g_device.erase(static_cast<char*>(p));
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  if (emu::injected("cudaHostAlloc")) return emu::fail(cudaErrorMemoryAllocation);
  *p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (!*p) return emu::fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_mu);
  g_pinned[static_cast<char*>(*p)] = std::max<size_t>(bytes, 1);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  if (!forget_pinned("cudaFreeHost", p)) return emu::fail(cudaErrorInvalidValue);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned) {
  if (!p || bytes == 0) return emu::fail(cudaErrorInvalidValue);
  if (emu::injected("cudaHostRegister")) return emu::fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_mu);
  auto* c = static_cast<char*>(p);
  if (holder(g_pinned, c, bytes_of) != g_pinned.end() || holder(g_pinned, c + bytes - 1, bytes_of) != g_pinned.end())
    return emu::fail(cudaErrorHostMemoryAlreadyRegistered);
  g_pinned[c] = bytes;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  return forget_pinned("cudaHostUnregister", p) ? cudaSuccess : emu::fail(cudaErrorHostMemoryNotRegistered);
}
// Unified addressing: pinned memory is mapped at its host address.
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  if (emu::where(h) != emu::Where::kPinned) return emu::fail(cudaErrorInvalidValue);
  *d = h;
  return cudaSuccess;
}

}  // extern "C"

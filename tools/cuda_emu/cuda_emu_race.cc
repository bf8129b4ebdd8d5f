// The race check inside a launch, and the chaos schedule's switch points. The .cu files are built
// with GCC's ThreadSanitizer instrumentation (-fsanitize=thread, CMakeLists.txt) but without its
// runtime: every load, store and atomic of their code calls the __tsan_* hooks below, which do
// nothing outside a kernel's threads. Inside one, each access is checked against the earlier
// accesses of the same launch to the same 2-byte granule:
// - global memory (cudaMalloc'd or pinned): two threads of different blocks race unless both
//   accesses are atomic (a launch has no barrier between blocks); two threads of one block race
//   unless a __syncthreads (or, for lanes of one warp, a shuffle) lies between them;
// - other memory a kernel reaches (its __shared__ arrays, dynamic shared memory) is its block's:
//   checked the same way within the block, and forgotten when the block ends;
// - a thread's own stack is never checked;
// - a read of shared memory (dynamic, or a static __shared__) that no thread of the block has
//   written yet aborts: shared memory starts undefined on a GPU, and a write the schedule runs
//   later without a barrier between is a race.
// A global access must also lie inside what the launch declared it uses (its pointer arguments'
// blocks, or its launcher's ZOE_KERNEL_SPANs; a kernel with an undeclared struct argument is not
// held to this): the streams' race check sees only those.
// Reads race with writes only; the check keeps the last write and the last read of a granule, so
// a write racing with an earlier read that a later, ordered read replaced is missed. A race aborts
// naming the kernel, both threads and the memory. CUDA_EMU_RACECHECK=0 turns the check off.
#include "cuda_emu_internal.h"  // first: cuda_emu.h defines the CUDA qualifiers before the CUDA headers do

#include <algorithm>
#include <iterator>
#include <memory>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace emu {
namespace {

struct Access {
  uint32_t block = 0, block_epoch = 0, warp_epoch = 0;
  uint16_t thread = 0;  // < 1024
  bool atomic = false, valid = false;
};
struct Cell {
  Access write, read;
};

// Granule -> Cell, in pages of consecutive granules. Every instrumented load and store of a
// kernel looks up one or two granules, so this is the emulation's hottest structure: a hash of
// single granules (std::unordered_map, or open addressing) scattered neighbours across memory and
// spent most of a kernel's time in cache misses; a kernel's threads walk memory in runs, and the
// pages of the last accesses serve most of the next ones. Those are kept in a small table indexed
// by a hash of the page: a kernel walks several arrays at once (Adam's gradient, master weights,
// m, v and weight copy), and one remembered page missed on every access there. clear() keeps the
// pages for reuse.
class ShadowMap {
 public:
  Cell& operator[](uintptr_t granule) {
    const uintptr_t page = granule >> kPageBits;
    Recent& r = recent_[(page * 0x9E3779B97F4A7C15ull) >> (64 - kRecentBits)];
    if (r.page == nullptr || r.key != page) {
      auto [it, added] = pages_.try_emplace(page, nullptr);
      if (added) it->second = take_page();
      r = {page, it->second};
    }
    return r.page->cells[granule & (kPageCells - 1)];
  }
  void clear() {
    for (auto& [key, page] : pages_) spare_.push_back(page);
    pages_.clear();
    std::fill(std::begin(recent_), std::end(recent_), Recent{});
  }

 private:
  static constexpr int kPageBits = 9;
  static constexpr uintptr_t kPageCells = uintptr_t{1} << kPageBits;
  static constexpr int kRecentBits = 4;
  struct Page {
    Cell cells[kPageCells];
  };
  struct Recent {
    uintptr_t key = 0;
    Page* page = nullptr;
  };
  Page* take_page() {
    if (spare_.empty()) {
      owned_.push_back(std::make_unique<Page>());
      return owned_.back().get();
    }
    Page* p = spare_.back();
    spare_.pop_back();
    std::fill(std::begin(p->cells), std::end(p->cells), Cell{});
    return p;
  }
  std::unordered_map<uintptr_t, Page*> pages_;
  std::vector<Page*> spare_;
  std::vector<std::unique_ptr<Page>> owned_;
  Recent recent_[1 << kRecentBits];
};

const bool g_check = [] {
  const char* e = std::getenv("CUDA_EMU_RACECHECK");
  return !e || std::string(e) != "0";
}();

// The launch that runs (one at a time: the streams' executor lock is held around it).
const char* g_kernel = nullptr;
std::vector<std::pair<const char*, const char*>> g_global;
std::vector<Range> g_uses;  // empty: not held to declared uses (kAllMemory)
size_t g_last_use = 0;      // the use the last access fell in: accesses come in runs
// Per use: read-only and overlapping no writable use, so that nothing the launch may do writes
// it (a write there dies as undeclared) and a read of it cannot race: no history is kept.
std::vector<char> g_use_unwritten;
ShadowMap g_global_cells;
// Per block alive in the launch: its shared memory's cells (blocks interleave, and each block's
// shared memory is its own even where two blocks' static __shared__ share an address in turn).
// Tables of blocks that ended are kept for the next (their slots' memory reused, not freed).
std::unordered_map<uint32_t, ShadowMap> g_block_cells;
std::vector<ShadowMap> g_spare_tables;

// The table of the block that ran last (blocks switch at barriers; accesses come in long runs).
uint32_t g_last_block = 0;
ShadowMap* g_last_table = nullptr;

ShadowMap& block_cells(uint32_t block) {
  if (g_last_table == nullptr || g_last_block != block) {
    g_last_table = &g_block_cells[block];  // node-based: stays valid until the block ends
    g_last_block = block;
  }
  return *g_last_table;
}

bool is_global(const char* p) {
  auto it = std::upper_bound(g_global.begin(), g_global.end(), std::make_pair(p, static_cast<const char*>(nullptr)),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  if (it == g_global.begin()) return false;
  --it;
  return p < it->second;
}

// a (earlier) happened before b in the launch: the same thread, or a barrier between them.
bool ordered(const Access& a, const Access& b) {
  if (a.block != b.block) return false;
  if (a.thread == b.thread || b.block_epoch > a.block_epoch) return true;
  return a.thread / 32 == b.thread / 32 && b.warp_epoch > a.warp_epoch;
}

std::string who(const Access& a) {
  return "thread " + std::to_string(a.thread) + " of block " + std::to_string(a.block);
}

[[noreturn]] void report(const char* p, bool global, const Access& earlier, bool earlier_write, const Access& now,
                         bool now_write) {
  die(std::string("race inside kernel ") + g_kernel + " on " + (global ? describe(p) : "its block's shared memory") +
      ": " + who(now) + (now_write ? " writes it" : " reads it") + " and " + who(earlier) +
      (earlier_write ? " wrote it" : " read it") +
      (earlier.block != now.block ? " (another block: only atomics may share memory across blocks)"
                                  : " with no __syncthreads between them") +
      (now.atomic || earlier.atomic ? "; one of them is not atomic" : ""));
}

void check(const void* addr, size_t bytes, bool write, bool atomic) {
  if (!g_check || !in_kernel() || bytes == 0) return;
  chaos_point();
  const char* p = static_cast<const char*>(addr);
  if (on_fiber_stack(p)) return;
  const bool global = is_global(p);
  if (global && !g_uses.empty()) {
    auto covers = [&](const Range& u) { return p >= u.p && p + bytes <= u.p + u.bytes && (u.write || !write); };
    bool inside = g_last_use < g_uses.size() && covers(g_uses[g_last_use]);
    for (size_t i = 0; i < g_uses.size() && !inside; ++i)
      if (covers(g_uses[i])) inside = true, g_last_use = i;
    if (!inside)
      die(std::string("kernel ") + g_kernel + (write ? " writes " : " reads ") + std::to_string(bytes) +
          " bytes of " + describe(p) + " outside what its launch declared" +
          (write ? " (a pointer-to-const argument, or a read-only ZOE_KERNEL_SPAN, is not written)" : "") +
          ": the streams' race check cannot see that use");
    if (!write && g_use_unwritten[g_last_use]) return;
  }
  const KernelThread t = current_thread();
  auto& cells = global ? g_global_cells : block_cells(t.block);
  // Shared memory starts undefined for each block: a read of bytes no thread of the block wrote.
  const bool check_unwritten = !global && !write && !atomic && maybe_shared(p);
  const bool note_static = !global && write && static_shared(p);
  Access now{t.block, t.block_epoch, t.warp_epoch, static_cast<uint16_t>(t.thread), atomic, true};
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) >> 1, last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) >> 1;
  for (uintptr_t g = first; g <= last; g++) {
    Cell& c = cells[g];
    if (check_unwritten && !c.write.valid)
      die(std::string("kernel ") + g_kernel + ": thread " + std::to_string(now.thread) + " of block " +
          std::to_string(now.block) + " reads " + std::to_string(bytes) +
          " bytes of its block's shared memory that no thread of the block has written yet (memory "
          "never written, or a missing __syncthreads between its writer and this read)");
    auto races = [&](const Access& a) { return a.valid && !(a.atomic && atomic) && !ordered(a, now); };
    if (races(c.write)) report(p, global, c.write, true, now, write);
    if (write && races(c.read)) report(p, global, c.read, false, now, write);
    if (note_static && !c.write.valid) note_static_write(g);
    if (write) {
      c.write = now;
      c.read = Access{};
    } else {
      c.read = now;
    }
  }
}

}  // namespace

void race_begin_launch(const char* name, const std::vector<Range>& uses) {
  g_kernel = name;
  g_uses.clear();
  for (const Range& u : uses) {
    if (u.p == nullptr) {  // kAllMemory: an undeclared struct argument
      g_uses.clear();
      break;
    }
    if (u.bytes) g_uses.push_back(u);
  }
  g_use_unwritten.assign(g_uses.size(), 1);
  for (size_t i = 0; i < g_uses.size(); ++i)
    for (const Range& w : g_uses)
      if (w.write && g_uses[i].p < w.p + w.bytes && w.p < g_uses[i].p + g_uses[i].bytes) g_use_unwritten[i] = 0;
  g_last_use = 0;
  if (g_check) g_global = global_ranges();
  g_global_cells.clear();
}
// Only where the kernels were built with the hooks (not under ASan) does the check see them.
#ifdef CUDA_EMU_INSTRUMENTED
bool race_checking() { return g_check; }
#else
bool race_checking() { return false; }
#endif
void race_begin_block(uint32_t linear) {
  auto [it, added] = g_block_cells.try_emplace(linear);
  if (added && !g_spare_tables.empty()) {
    it->second = std::move(g_spare_tables.back());
    g_spare_tables.pop_back();
  }
  it->second.clear();
}
void race_end_block(uint32_t linear) {
  g_last_table = nullptr;
  auto it = g_block_cells.find(linear);
  if (it == g_block_cells.end()) return;
  g_spare_tables.push_back(std::move(it->second));
  g_block_cells.erase(it);
}
void race_end_launch() {
  g_global_cells.clear();
  g_last_table = nullptr;
  for (auto& [block, table] : g_block_cells) g_spare_tables.push_back(std::move(table));
  g_block_cells.clear();
  g_kernel = nullptr;
}

}  // namespace emu

// The instrumentation's entry points (the names and signatures GCC's -fsanitize=thread calls).
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_read1(void* p) { emu::check(p, 1, false, false); }
void __tsan_read2(void* p) { emu::check(p, 2, false, false); }
void __tsan_read4(void* p) { emu::check(p, 4, false, false); }
void __tsan_read8(void* p) { emu::check(p, 8, false, false); }
void __tsan_read16(void* p) { emu::check(p, 16, false, false); }
void __tsan_write1(void* p) { emu::check(p, 1, true, false); }
void __tsan_write2(void* p) { emu::check(p, 2, true, false); }
void __tsan_write4(void* p) { emu::check(p, 4, true, false); }
void __tsan_write8(void* p) { emu::check(p, 8, true, false); }
void __tsan_write16(void* p) { emu::check(p, 16, true, false); }
void __tsan_unaligned_read2(void* p) { emu::check(p, 2, false, false); }
void __tsan_unaligned_read4(void* p) { emu::check(p, 4, false, false); }
void __tsan_unaligned_read8(void* p) { emu::check(p, 8, false, false); }
void __tsan_unaligned_read16(void* p) { emu::check(p, 16, false, false); }
void __tsan_unaligned_write2(void* p) { emu::check(p, 2, true, false); }
void __tsan_unaligned_write4(void* p) { emu::check(p, 4, true, false); }
void __tsan_unaligned_write8(void* p) { emu::check(p, 8, true, false); }
void __tsan_unaligned_write16(void* p) { emu::check(p, 16, true, false); }
void __tsan_read_range(void* p, unsigned long n) { emu::check(p, n, false, false); }
void __tsan_write_range(void* p, unsigned long n) { emu::check(p, n, true, false); }
// Atomics (memory order ignored: one thread runs at a time). atomicAdd is std::atomic_ref's
// fetch_add (cuda_emu.h), which reaches these.
int32_t __tsan_atomic32_fetch_add(volatile int32_t* a, int32_t v, int) {
  emu::check(const_cast<int32_t*>(a), 4, true, true);
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
int64_t __tsan_atomic64_fetch_add(volatile int64_t* a, int64_t v, int) {
  emu::check(const_cast<int64_t*>(a), 8, true, true);
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
int32_t __tsan_atomic32_load(const volatile int32_t* a, int) {
  emu::check(const_cast<int32_t*>(a), 4, false, true);
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
int64_t __tsan_atomic64_load(const volatile int64_t* a, int) {
  emu::check(const_cast<int64_t*>(a), 8, false, true);
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
int __tsan_atomic32_compare_exchange_strong(volatile int32_t* a, int32_t* c, int32_t v, int, int) {
  emu::check(const_cast<int32_t*>(a), 4, true, true);
  return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
int __tsan_atomic64_compare_exchange_strong(volatile int64_t* a, int64_t* c, int64_t v, int, int) {
  emu::check(const_cast<int64_t*>(a), 8, true, true);
  return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
}  // extern "C"

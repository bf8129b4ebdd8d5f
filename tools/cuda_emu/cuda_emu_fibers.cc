// The fiber scheduler behind cuda_emu.h's kernels: the threads of a block are fibers switched
// only at __syncthreads and warp shuffles (and, under chaos, at memory accesses); several blocks
// of a grid are alive at once and the schedule interleaves their rounds. Runs on a stream's
// worker, one grid at a time (cuda_emu_streams.cc holds the lock).
//
// Fibers switch through a few instructions (emu_switch below: the callee-saved registers and the
// stack pointer), not swapcontext, whose signal-mask system call per switch took most of the
// emulated engine's time. x86-64 System V only, as this project is.
#include "cuda_emu_internal.h"  // first: cuda_emu.h defines the CUDA qualifiers before the CUDA headers do

#include <link.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace emu {

void die(const std::string& m) {
  std::fprintf(stderr, "cuda_emu: %s\n", m.c_str());
  std::abort();
}

namespace {

enum State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

// Saves the callee-saved registers on the current stack, stores its pointer in *from, and resumes
// the stack `to` (saved the same way, or prepared by start_fiber).
extern "C" void emu_switch(void** from, void* to);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");

struct Fiber {
  void* sp = nullptr;  // its saved stack pointer while switched out
  char* stack = nullptr;  // kStackBytes of g_stacks
  State state = kRunnable;
  const char* barrier_file = nullptr;  // at kAtBlockBarrier: the __syncthreads it waits at
  int barrier_line = 0;
};

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;
constexpr int kMaxResident = 4;  // blocks of a launch alive at once
constexpr int kStackColors = 64;  // a 4 KiB page's cache lines (start_fiber)

// All fibers' stacks, one mapping (touched pages only are memory): the race check
// (cuda_emu_race.cc) tells a thread's own stack from shared and global memory by it. A resident
// block's threads use the stacks of its slot.
char* const g_stacks = [] {
  void* m = mmap(nullptr, kStackBytes * kMaxThreads * kMaxResident, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) die("cannot map the fibers' stacks");
  return static_cast<char*>(m);
}();

// A block of the launch that runs: its threads and, between rounds, where its schedule stands.
struct Block {
  uint3 idx{};
  uint32_t linear = 0;    // x + y * grid.x + z * grid.x * grid.y
  int slot = 0;           // which stacks its fibers use
  std::vector<Fiber> fibers;
  std::vector<double> slots;   // one shuffle slot per thread
  std::vector<const uint32_t*> frags;  // per thread: its mma fragments (a[4], b[2]) while in one
  std::vector<float> smem;     // its dynamic shared memory
  // Its static __shared__: every launch's blocks share the variables' addresses (they are C++
  // statics), so the 2-byte granules the block wrote (the race check notes them) are put aside
  // while another block runs, and back before it runs again.
  std::vector<uintptr_t> statics;
  std::vector<uint16_t> statics_saved;
  uint32_t epoch = 0;                // __syncthreads it has passed
  std::vector<uint32_t> warp_epoch;  // per warp: shuffles (warp barriers) it has passed
  // The threads its next round runs: every thread first, then those a barrier released (one warp
  // after a shuffle), or those the chaos schedule switched out mid-segment.
  std::vector<int> run, again, ready;
  std::vector<int> warp_live, warp_waiting;
  int live = 0, at_block = 0;
  bool descending = true;  // alternating starts descending
};

Dims g_dims;
Block* g_cur = nullptr;        // the block whose thread runs
Block* g_in_memory = nullptr;  // the block whose static __shared__ are in memory now
int g_current = -1;            // that thread's index in its block
void* g_sched = nullptr;  // the scheduler's saved stack pointer
const std::function<void()>* g_body = nullptr;
const char* g_name = "";  // the kernel that runs
thread_local bool t_in_grid = false;  // this OS thread runs a grid's fibers now
// CUDA_EMU_SCHEDULE: ascending (one block at a time, in order), alternating (two blocks alive,
// round by round in turn; threads in ascending / descending phases, the last ready warp first),
// random (the default: four blocks alive, a seeded random one's round next, threads in random
// order), chaos (random, and a thread may also be switched out at any memory access of a kernel:
// cuda_emu_race.cc's hooks call chaos_point). CUDA_EMU_SEED seeds the random ones (default 12345).
const int g_schedule = [] {
  const char* e = std::getenv("CUDA_EMU_SCHEDULE");
  const std::string s = e ? e : "random";
  if (s != "ascending" && s != "alternating" && s != "random" && s != "chaos")
    die("CUDA_EMU_SCHEDULE must be ascending, alternating, random or chaos, not \"" + s + "\"");
  return s == "alternating" ? 1 : s == "random" ? 2 : s == "chaos" ? 3 : 0;
}();
std::mt19937 g_rng([] {
  const char* e = std::getenv("CUDA_EMU_SEED");
  return e ? static_cast<unsigned>(std::strtoul(e, nullptr, 10)) : 12345u;
}());
bool shuffled() { return g_schedule >= 2; }
// Without the race check nothing notes the blocks' static __shared__ writes: one block at a time.
int resident_blocks() { return !race_checking() || g_schedule == 0 ? 1 : g_schedule == 1 ? 2 : kMaxResident; }

// Where a fiber starts (emu_switch returns into it); it never returns, a done fiber is left.
[[noreturn]] void fiber_entry() {
  (*g_body)();
  Fiber& f = g_cur->fibers[g_current];
  f.state = kDone;
  emu_switch(&f.sp, g_sched);
  die("a finished fiber was resumed");
}

// A fresh stack for f whose first switch enters fiber_entry as if called (16-byte aligned frame).
// Its top is offset by `color` cache lines: stacks kStackBytes apart would put every thread's
// frame (its saved registers, the kernel's locals) in the same L1 sets, which a block's hundreds
// of threads, run in turn, evicted from each other on every switch.
void start_fiber(Fiber& f, int color) {
  auto top = reinterpret_cast<uintptr_t>(f.stack + kStackBytes - 64 * (color % kStackColors)) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                     // fiber_entry's return address (never used)
  *--sp = reinterpret_cast<void*>(&fiber_entry);       // emu_switch's ret goes here
  for (int i = 0; i < 6; i++) *--sp = nullptr;         // rbp rbx r12 r13 r14 r15
  f.sp = sp;
}

void yield(State s) {
  Fiber& f = g_cur->fibers[g_current];
  f.state = s;
  emu_switch(&f.sp, g_sched);
}

uint3 thread_of(int t, dim3 block) {
  uint3 u;
  u.x = t % block.x;
  u.y = (t / block.x) % block.y;
  u.z = t / (block.x * block.y);
  return u;
}

// Puts the threads released for a round in the schedule's order.
void order_round(std::vector<int>& run, bool descending) {
  if (g_schedule == 1 && descending) std::reverse(run.begin(), run.end());
  if (shuffled()) std::shuffle(run.begin(), run.end(), g_rng);
}

std::string block_name(const Block& b) {
  std::string r = "(";
  r += std::to_string(b.idx.x);
  r += ",";
  r += std::to_string(b.idx.y);
  return r + ")";
}

// Every live thread of the block waits at the same __syncthreads: one in a branch that some
// threads skip for another is undefined on a GPU (a hang, or a barrier that does not hold).
void check_one_barrier(const Block& b) {
  const Fiber* first = nullptr;
  for (size_t t = 0; t < b.fibers.size(); t++) {
    const Fiber& f = b.fibers[t];
    if (f.state != kAtBlockBarrier) continue;
    if (!first) first = &f;
    else if (f.barrier_line != first->barrier_line || std::strcmp(f.barrier_file, first->barrier_file) != 0)
      die(std::string("divergent __syncthreads in kernel ") + g_name + ": threads of block " + block_name(b) +
          " wait at different __syncthreads calls (thread " + std::to_string(t) + " at " + f.barrier_file + ":" +
          std::to_string(f.barrier_line) + ", another at " + first->barrier_file + ":" +
          std::to_string(first->barrier_line) + ")");
  }
}

void start_block(Block& b, uint3 idx, dim3 grid, int nthreads, size_t smem_bytes) {
  b.idx = idx;
  b.linear = idx.x + grid.x * (idx.y + grid.y * idx.z);
  b.fibers.resize(nthreads);
  for (int t = 0; t < nthreads; t++) {
    Fiber& f = b.fibers[t];
    f = Fiber{};
    f.stack = g_stacks + (size_t(b.slot) * kMaxThreads + t) * kStackBytes;
    start_fiber(f, t);
  }
  b.slots.assign(nthreads, 0.0);
  b.frags.assign(nthreads, nullptr);
  b.smem.assign(smem_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
  b.statics.clear();
  b.statics_saved.clear();
  const int nwarps = (nthreads + 31) / 32;
  b.epoch = 0;
  b.warp_epoch.assign(nwarps, 0);
  b.run.resize(nthreads);
  for (int t = 0; t < nthreads; t++) b.run[t] = t;
  b.again.clear();
  b.warp_live.assign(nwarps, 32);
  if (nthreads % 32) b.warp_live.back() = nthreads % 32;
  b.warp_waiting.assign(nwarps, 0);
  b.live = nthreads, b.at_block = 0;
  b.descending = true;
  race_begin_block(b.linear);
}

// Makes b the block that runs: its static __shared__ in memory (the last one's put aside).
void switch_to(Block& b) {
  if (g_in_memory != &b) {
    if (Block* o = g_in_memory) {
      o->statics_saved.resize(o->statics.size());
      for (size_t i = 0; i < o->statics.size(); i++)
        std::memcpy(&o->statics_saved[i], reinterpret_cast<const void*>(o->statics[i] << 1), 2);
    }
    for (size_t i = 0; i < b.statics_saved.size(); i++)
      std::memcpy(reinterpret_cast<void*>(b.statics[i] << 1), &b.statics_saved[i], 2);
  }
  g_in_memory = &b;
  g_cur = &b;
  g_dims.block_idx = b.idx;
}

// One round of b: its released threads run, one after another in the schedule's order, each
// until it blocks (a barrier) or ends; then the next round's threads are released. Returns
// whether the block has live threads left.
bool run_round(Block& b) {
  const int nthreads = static_cast<int>(b.fibers.size()), nwarps = (nthreads + 31) / 32;
  // Between two barriers threads run one after another in this order; a schedule other than
  // ascending exposes reads of shared memory that lack a barrier after the write.
  order_round(b.run, b.descending);
  b.descending = !b.descending;
  for (int t : b.run) {
    g_current = t;
    g_dims.thread_idx = thread_of(t, g_dims.block);
    emu_switch(&g_sched, b.fibers[t].sp);
  }
  // Counts kept per round from the threads that ran, not by scanning the block.
  for (int t : b.run) {
    const State st = b.fibers[t].state;
    b.live -= st == kDone;
    b.warp_live[t / 32] -= st == kDone;
    b.at_block += st == kAtBlockBarrier;
    b.warp_waiting[t / 32] += st == kAtWarpBarrier;
    if (st == kRunnable) b.again.push_back(t);  // switched out mid-segment (chaos): runs again first
  }
  b.run.clear();
  if (b.live == 0) return false;
  if (!b.again.empty()) {
    b.run.swap(b.again);
    return true;
  }
  // A warp whose live lanes all wait at a shuffle goes on. One such warp at a time, and it runs
  // alone until it blocks again: warps drift apart as far as they legally can (to the next
  // __syncthreads), which exposes shared memory read from another warp without a barrier.
  b.ready.clear();
  for (int w = 0; w < nwarps; w++)
    if (b.warp_waiting[w] > 0 && b.warp_waiting[w] == b.warp_live[w]) b.ready.push_back(w);
  if (b.ready.empty() && b.at_block != b.live)
    die("deadlock: threads of block " + block_name(b) + " wait at different barriers (" + std::to_string(b.at_block) +
        " of " + std::to_string(b.live) + " live threads at __syncthreads; the rest at a shuffle whose warp is split)");
  if (b.ready.empty()) check_one_barrier(b);
  const State release = b.ready.empty() ? kAtBlockBarrier : kAtWarpBarrier;
  int lo = 0, hi = nthreads;
  if (release == kAtWarpBarrier) {
    const int w = shuffled() ? b.ready[g_rng() % b.ready.size()] : g_schedule == 1 ? b.ready.back() : b.ready.front();
    lo = w * 32;
    hi = std::min(nthreads, w * 32 + 32);
    b.warp_waiting[w] = 0;
    b.warp_epoch[w]++;
  } else {
    b.at_block = 0;
    b.epoch++;
  }
  for (int t = lo; t < hi; t++)
    if (b.fibers[t].state == release) {
      b.fibers[t].state = kRunnable;
      b.run.push_back(t);
    }
  return true;
}

}  // namespace

Dims& dims() { return g_dims; }

void syncthreads(const char* file, int line) {
  g_cur->fibers[g_current].barrier_file = file;
  g_cur->fibers[g_current].barrier_line = line;
  yield(kAtBlockBarrier);
}

// Both lanes of a shuffle write their slot, wait at the warp barrier, read the partner's. The
// kernels' shuffles name the full warp (kFullMask): every lane of it must take part, none may have
// exited nor wait at an mma.sync instead (a GPU's result would be undefined, often a hang).
static double exchange(double v, int partner) {
  Block& b = *g_cur;
  const int me = g_current, w = me / 32, base = 32 * w;
  b.slots[me] = v;
  yield(kAtWarpBarrier);
  const int lanes = std::min(32, static_cast<int>(b.fibers.size()) - base);
  if (b.warp_live[w] != lanes)
    die(std::string(g_name) + ": a full-warp shuffle after " + std::to_string(lanes - b.warp_live[w]) +
        " lane(s) of the warp exited (every lane the mask names must execute it)");
  for (int l = base; l < base + lanes; l++)
    if (b.frags[l]) die(std::string(g_name) + ": a shuffle while lane " + std::to_string(l - base) +
                        " of its warp is at an mma.sync");
  if (partner >= static_cast<int>(b.fibers.size()) || b.fibers[partner].state == kDone)
    die("shuffle with a lane that has exited or does not exist");
  const double r = b.slots[partner];
  yield(kAtWarpBarrier);  // nobody overwrites a slot before its partner has read it
  return r;
}

double shfl_xor(double v, int offset) {
  const int me = g_current;
  return exchange(v, (me & ~31) | ((me & 31) ^ offset));
}

double shfl_down(double v, int offset) {
  const int me = g_current;
  return exchange(v, (me & 31) + offset < 32 ? me + offset : me);
}

// Every lane publishes its fragments and waits at the warp barrier; each then reads the elements
// of its four outputs' rows of A and columns of B from the lanes that hold them (PTX's layout:
// lane 4g + t holds A's rows g and g + 8 and B's column g, at k = 2t, 2t + 1, 2t + 8, 2t + 9), and
// waits again so that no lane's fragments go out of scope while another reads them. The products of
// bf16 values are exact in fp32; they are added in k order onto the accumulator (a tensor core's
// order and rounding of these sums are its own: callers compare within a tolerance).
void mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b) {
  Block& bl = *g_cur;
  const int me = g_current, w = me / 32, base = w * 32;
  const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  bl.frags[me] = mine;
  yield(kAtWarpBarrier);
  if (bl.warp_live[w] != 32)
    die(std::string(g_name) + ": mma.sync in a warp of fewer than 32 live lanes (every lane must execute it)");
  for (int l = base; l < base + 32; l++)
    if (!bl.frags[l]) die(std::string(g_name) + ": mma.sync while lane " + std::to_string(l - base) +
                          " of its warp is at another warp-wide operation");
  auto half = [](uint32_t u, int hi) { return __uint_as_float((hi ? u >> 16 : u & 0xffffu) << 16); };
  const int lane = me & 31, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; i++) {
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float acc = d[i];
    for (int k = 0; k < 16; k++) {
      const uint32_t* fa = bl.frags[base + (row % 8) * 4 + (k % 8) / 2];
      const uint32_t* fb = bl.frags[base + col * 4 + (k % 8) / 2];
      acc += half(fa[(row >= 8) + 2 * (k >= 8)], k & 1) * half(fb[4 + (k >= 8)], k & 1);
    }
    d[i] = acc;
  }
  yield(kAtWarpBarrier);
  bl.frags[me] = nullptr;
}

float* dynamic_smem() { return g_cur->smem.data(); }

bool in_kernel() { return t_in_grid && g_current >= 0; }

KernelThread current_thread() {
  return {g_cur->linear, static_cast<uint32_t>(g_current), g_cur->epoch, g_cur->warp_epoch[g_current / 32]};
}

bool on_fiber_stack(const void* p) {
  const char* c = static_cast<const char*>(p);
  return c >= g_stacks && c < g_stacks + kStackBytes * kMaxThreads * kMaxResident;
}

// The process's writable PT_LOAD segments (where static __shared__ variables live), sorted by
// start: the race check asks for every non-global access (a struct argument's field too), so a
// binary search, not a scan of every loaded library's segments.
static std::vector<std::pair<const char*, const char*>> writable_segments() {
  std::vector<std::pair<const char*, const char*>> r;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        for (int i = 0; i < info->dlpi_phnum; i++) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD && (ph.p_flags & PF_W)) {
            const char* b = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
            static_cast<std::vector<std::pair<const char*, const char*>>*>(out)->emplace_back(b, b + ph.p_memsz);
          }
        }
        return 0;
      },
      &r);
  std::sort(r.begin(), r.end());
  return r;
}

bool static_shared(const void* p) {
  static const std::vector<std::pair<const char*, const char*>> statics = writable_segments();
  const char* c = static_cast<const char*>(p);
  const char* dims = reinterpret_cast<const char*>(&g_dims);
  if (c >= dims && c < dims + sizeof g_dims) return false;
  auto it = std::upper_bound(statics.begin(), statics.end(), c,
                             [](const char* x, const std::pair<const char*, const char*>& s) { return x < s.first; });
  return it != statics.begin() && c < std::prev(it)->second;
}

bool maybe_shared(const void* p) {
  const char* c = static_cast<const char*>(p);
  const char* smem = reinterpret_cast<const char*>(g_cur->smem.data());
  if (c >= smem && c < smem + g_cur->smem.size() * sizeof(float)) return true;
  return static_shared(p);
}

void note_static_write(uintptr_t granule) { g_cur->statics.push_back(granule); }

void chaos_point() {
  if (g_schedule == 3 && in_kernel() && g_rng() % 8 == 0) yield(kRunnable);
}

// Runs the grid's blocks, up to resident_blocks() alive at once (CUDA runs as many as the SMs
// hold, in no set order): the schedule picks whose round runs next, so blocks interleave at their
// barriers (and, under chaos, anywhere). A block that ends makes room for the next in grid order.
void run_grid(dim3 grid, dim3 block, size_t smem_bytes, const char* name, const std::vector<Range>& uses,
              const std::function<void()>& body) {
  const int nthreads = static_cast<int>(block.x * block.y * block.z);
  if (nthreads <= 0 || nthreads > kMaxThreads) die("bad block size " + std::to_string(nthreads));
  if (grid.y > 65535 || grid.z > 65535) die("grid y/z above 65535");
  if (smem_bytes > 227 * 1024) die("dynamic shared memory above 227 KiB: " + std::to_string(smem_bytes));
  g_dims.grid = grid;
  g_dims.block = block;
  g_body = &body;
  g_name = name;
  t_in_grid = true;
  race_begin_launch(name, uses);
  const uint64_t total = uint64_t{grid.x} * grid.y * grid.z;
  uint64_t next = 0;  // the next block of the grid to start, in linear order
  Block slots[kMaxResident];
  std::vector<Block*> alive;
  for (int i = 0; i < kMaxResident; i++) slots[i].slot = i;
  std::vector<Block*> free_slots;
  for (int i = resident_blocks() - 1; i >= 0; i--) free_slots.push_back(&slots[i]);
  size_t turn = 0;  // alternating: whose round is next
  while (next < total || !alive.empty()) {
    while (next < total && !free_slots.empty()) {
      Block* b = free_slots.back();
      free_slots.pop_back();
      const uint3 idx{static_cast<unsigned>(next % grid.x), static_cast<unsigned>(next / grid.x % grid.y),
                      static_cast<unsigned>(next / (uint64_t{grid.x} * grid.y))};
      start_block(*b, idx, grid, nthreads, smem_bytes);
      alive.push_back(b);
      next++;
    }
    const size_t k = shuffled() ? g_rng() % alive.size() : turn++ % alive.size();
    Block& b = *alive[k];
    switch_to(b);
    if (run_round(b)) continue;
    race_end_block(b.linear);
    if (g_in_memory == &b) g_in_memory = nullptr;  // its static __shared__ are nobody's now
    alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(k));
    free_slots.push_back(&b);
  }
  race_end_launch();
  t_in_grid = false;
  g_current = -1;
  g_cur = nullptr;
  g_in_memory = nullptr;
  g_body = nullptr;
}

}  // namespace emu

// The fiber scheduler behind cuda_emu.h's kernels: the blocks of a grid run one after another,
// the threads of a block are fibers switched only at __syncthreads and warp shuffles. Runs on a
// stream's worker, one grid at a time (cuda_emu_streams.cc holds the lock).
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

// All fibers' stacks, one mapping (touched pages only are memory): the race check
// (cuda_emu_race.cc) tells a thread's own stack from shared and global memory by it.
char* const g_stacks = [] {
  void* m = mmap(nullptr, kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) die("cannot map the fibers' stacks");
  return static_cast<char*>(m);
}();

Dims g_dims;
std::vector<Fiber> g_fibers;
int g_current = -1;
void* g_sched = nullptr;  // the scheduler's saved stack pointer
const std::function<void()>* g_body = nullptr;
const char* g_name = "";  // the kernel that runs
thread_local bool t_in_grid = false;  // this OS thread runs a grid's fibers now
uint32_t g_block_linear = 0;          // the block that runs: x + y * grid.x + z * grid.x * grid.y
uint32_t g_block_epoch = 0;           // __syncthreads the block has passed
std::vector<uint32_t> g_warp_epoch;   // per warp: shuffles (warp barriers) it has passed
std::vector<double> g_slots;  // one shuffle slot per thread
std::vector<float> g_smem;
// CUDA_EMU_SCHEDULE: ascending, alternating (ascending / descending phases, the last ready warp
// first), random (the default), chaos (random, and a thread may also be switched out at any
// memory access of a kernel: cuda_emu_race.cc's hooks call chaos_point). CUDA_EMU_SEED seeds the
// random ones (default 12345).
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

// Where a fiber starts (emu_switch returns into it); it never returns, a done fiber is left.
[[noreturn]] void fiber_entry() {
  (*g_body)();
  Fiber& f = g_fibers[g_current];
  f.state = kDone;
  emu_switch(&f.sp, g_sched);
  die("a finished fiber was resumed");
}

// A fresh stack for f whose first switch enters fiber_entry as if called (16-byte aligned frame).
void start_fiber(Fiber& f) {
  auto top = reinterpret_cast<uintptr_t>(f.stack + kStackBytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                     // fiber_entry's return address (never used)
  *--sp = reinterpret_cast<void*>(&fiber_entry);       // emu_switch's ret goes here
  for (int i = 0; i < 6; i++) *--sp = nullptr;         // rbp rbx r12 r13 r14 r15
  f.sp = sp;
}

void yield(State s) {
  Fiber& f = g_fibers[g_current];
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

// Every live thread of the block waits at the same __syncthreads: one in a branch that some
// threads skip for another is undefined on a GPU (a hang, or a barrier that does not hold).
void check_one_barrier(int nthreads) {
  const Fiber* first = nullptr;
  for (int t = 0; t < nthreads; t++) {
    const Fiber& f = g_fibers[t];
    if (f.state != kAtBlockBarrier) continue;
    if (!first) first = &f;
    else if (f.barrier_line != first->barrier_line || std::strcmp(f.barrier_file, first->barrier_file) != 0)
      die(std::string("divergent __syncthreads in kernel ") + g_name + ": threads of block (" +
          std::to_string(g_dims.block_idx.x) + "," + std::to_string(g_dims.block_idx.y) +
          ") wait at different __syncthreads calls (thread " + std::to_string(t) + " at " + f.barrier_file + ":" +
          std::to_string(f.barrier_line) + ", another at " + first->barrier_file + ":" +
          std::to_string(first->barrier_line) + ")");
  }
}

void run_block(int nthreads) {
  for (int t = 0; t < nthreads; t++) {
    Fiber& f = g_fibers[t];
    f.state = kRunnable;
    start_fiber(f);
  }
  const int nwarps = (nthreads + 31) / 32;
  // The threads a round runs: every thread first, then those a barrier released (one warp after
  // a shuffle). Only they are ordered, so a round costs its own threads, not the block's.
  std::vector<int> run(nthreads);
  for (int t = 0; t < nthreads; t++) run[t] = t;
  bool descending = true;  // alternating starts descending
  int live = nthreads, at_block = 0;
  std::vector<int> warp_live(nwarps, 32), warp_waiting(nwarps, 0), ready, again;
  g_block_epoch = 0;
  g_warp_epoch.assign(nwarps, 0);
  if (nthreads % 32) warp_live.back() = nthreads % 32;
  for (;;) {
    // Between two barriers threads run one after another in this order; a schedule other than
    // ascending exposes reads of shared memory that lack a barrier after the write.
    order_round(run, descending);
    descending = !descending;
    for (int t : run) {
      g_current = t;
      g_dims.thread_idx = thread_of(t, g_dims.block);
      emu_switch(&g_sched, g_fibers[t].sp);
    }
    // Counts kept per round from the threads that ran, not by scanning the block.
    for (int t : run) {
      const State st = g_fibers[t].state;
      live -= st == kDone;
      warp_live[t / 32] -= st == kDone;
      at_block += st == kAtBlockBarrier;
      warp_waiting[t / 32] += st == kAtWarpBarrier;
      if (st == kRunnable) again.push_back(t);  // switched out mid-segment (chaos): runs again first
    }
    run.clear();
    if (live == 0) return;
    if (!again.empty()) {
      run.swap(again);
      continue;
    }
    // A warp whose live lanes all wait at a shuffle goes on. One such warp at a time, and it runs
    // alone until it blocks again: warps drift apart as far as they legally can (to the next
    // __syncthreads), which exposes shared memory read from another warp without a barrier.
    ready.clear();
    for (int w = 0; w < nwarps; w++)
      if (warp_waiting[w] > 0 && warp_waiting[w] == warp_live[w]) ready.push_back(w);
    if (ready.empty() && at_block != live)
      die("deadlock: threads of block (" + std::to_string(g_dims.block_idx.x) + "," +
          std::to_string(g_dims.block_idx.y) + ") wait at different barriers (" + std::to_string(at_block) +
          " of " + std::to_string(live) + " live threads at __syncthreads; the rest at a shuffle whose warp is split)");
    if (ready.empty()) check_one_barrier(nthreads);
    const State release = ready.empty() ? kAtBlockBarrier : kAtWarpBarrier;
    int lo = 0, hi = nthreads;
    if (release == kAtWarpBarrier) {
      const int w = shuffled() ? ready[g_rng() % ready.size()] : g_schedule == 1 ? ready.back() : ready.front();
      lo = w * 32;
      hi = std::min(nthreads, w * 32 + 32);
      warp_waiting[w] = 0;
      g_warp_epoch[w]++;
    } else {
      at_block = 0;
      g_block_epoch++;
    }
    for (int t = lo; t < hi; t++)
      if (g_fibers[t].state == release) {
        g_fibers[t].state = kRunnable;
        run.push_back(t);
      }
  }
}

}  // namespace

Dims& dims() { return g_dims; }

void syncthreads(const char* file, int line) {
  g_fibers[g_current].barrier_file = file;
  g_fibers[g_current].barrier_line = line;
  yield(kAtBlockBarrier);
}

double shfl_xor(double v, int offset) {
  const int me = g_current;
  const int partner = (me & ~31) | ((me & 31) ^ offset);
  g_slots[me] = v;
  yield(kAtWarpBarrier);
  if (partner >= static_cast<int>(g_fibers.size()) || g_fibers[partner].state == kDone)
    die("shuffle with a lane that has exited or does not exist");
  const double r = g_slots[partner];
  yield(kAtWarpBarrier);  // nobody overwrites a slot before its partner has read it
  return r;
}

double shfl_down(double v, int offset) {
  const int me = g_current;
  const int partner = (me & 31) + offset < 32 ? me + offset : me;
  g_slots[me] = v;
  yield(kAtWarpBarrier);
  if (partner >= static_cast<int>(g_fibers.size()) || g_fibers[partner].state == kDone)
    die("shuffle with a lane that has exited or does not exist");
  const double r = g_slots[partner];
  yield(kAtWarpBarrier);
  return r;
}

float* dynamic_smem() { return g_smem.data(); }

bool in_kernel() { return t_in_grid && g_current >= 0; }

KernelThread current_thread() {
  return {g_block_linear, static_cast<uint32_t>(g_current), g_block_epoch, g_warp_epoch[g_current / 32]};
}

bool on_fiber_stack(const void* p) {
  const char* c = static_cast<const char*>(p);
  return c >= g_stacks && c < g_stacks + kStackBytes * kMaxThreads;
}

bool maybe_shared(const void* p) {
  static const std::vector<std::pair<const char*, const char*>> statics = [] {
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
    return r;
  }();
  const char* c = static_cast<const char*>(p);
  const char* smem = reinterpret_cast<const char*>(g_smem.data());
  if (c >= smem && c < smem + g_smem.size() * sizeof(float)) return true;
  const char* dims = reinterpret_cast<const char*>(&g_dims);
  if (c >= dims && c < dims + sizeof g_dims) return false;
  for (const auto& [b, e] : statics)
    if (c >= b && c < e) return true;
  return false;
}

void chaos_point() {
  if (g_schedule == 3 && in_kernel() && g_rng() % 8 == 0) yield(kRunnable);
}

// Device memory is closed to host code (PROT_NONE) except while a kernel, a copy or a GEMM runs:
// host code that reads or writes it faults, and the handler names the allocation.
void run_grid(dim3 grid, dim3 block, size_t smem_bytes, const char* name, const std::vector<Range>& uses,
              const std::function<void()>& body) {
  const int nthreads = static_cast<int>(block.x * block.y * block.z);
  if (nthreads <= 0 || nthreads > kMaxThreads) die("bad block size " + std::to_string(nthreads));
  if (grid.y > 65535 || grid.z > 65535) die("grid y/z above 65535");
  if (smem_bytes > 227 * 1024) die("dynamic shared memory above 227 KiB: " + std::to_string(smem_bytes));
  if (g_fibers.size() < static_cast<size_t>(nthreads)) {
    g_fibers.resize(nthreads);
    for (size_t t = 0; t < g_fibers.size(); t++) g_fibers[t].stack = g_stacks + t * kStackBytes;
  }
  g_slots.assign(nthreads, 0.0);
  g_dims.grid = grid;
  g_dims.block = block;
  g_body = &body;
  g_name = name;
  t_in_grid = true;
  race_begin_launch(name, uses);
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        g_dims.block_idx = uint3{x, y, z};
        g_block_linear = x + grid.x * (y + grid.y * z);
        g_smem.assign(smem_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
        race_begin_block();
        run_block(nthreads);
      }
  race_end_launch();
  t_in_grid = false;
  g_current = -1;
  g_body = nullptr;
}

}  // namespace emu

// A CPU emulation of the CUDA src/gpu uses (the model, Adam and engine kernels, CudaDevice's runtime
// calls), to run them and their tests on a machine without a GPU (tools/cuda_emu/run.sh).
// Force-included (g++ -include) before a .cu, which is then compiled as C++.
//
// The threads of a block are fibers on one OS thread, switched at __syncthreads and warp
// shuffles (and, under CUDA_EMU_SCHEDULE=chaos, at any memory access); up to four blocks of a
// launch are alive at once, their rounds interleaved in a seeded order (one at a time under the
// ascending schedule, or without the race check: CUDA_EMU_RACECHECK=0, or the ASan build).
// Streams are asynchronous: each is a worker thread that runs its queue in order, later than the
// host enqueued it (CUDA_EMU_DELAY=<max microseconds> adds a random delay before each operation);
// events, stream waits and the synchronize calls order them as CUDA does; one operation executes
// at a time. What it checks beyond the arithmetic: a barrier or shuffle that not every live thread
// (lane) reaches aborts with a message, as do __syncthreads reached at different calls and a
// shuffle whose partner lane has exited; inside a launch, accesses of different blocks to the same
// memory (unless both atomic) and of one block's threads with no barrier between them abort
// (cuda_emu_race.cc), as do a kernel touching device memory outside what its launch declared and
// a read of shared memory (static or dynamic) that no thread of the block wrote;
// launches beyond CUDA's limits fail as CUDA fails them (cudaGetLastError); dynamic
// shared memory and cudaMalloc'd memory start as NaN, so reading what was never written shows up;
// cudaMalloc'd memory is closed to host code (PROT_NONE) outside kernels, copies and GEMMs, and a
// touch names the allocation; a cudaMemcpy kind that does not match where its pointers are aborts;
// an operation that starts while work of another stream that was queued before it, and uses the
// same memory (one of them writing), has not run is a race (a missing event wait, or memory handed
// on before its last user finished) and aborts naming both; freeing memory queued work still uses
// aborts; pinned host memory a queued copy reads or writes that changes before the copy runs (a
// host write or an NVMe read into a buffer whose copy has not run) aborts; a copy's pinned
// destination is poisoned at the call (0xff bytes), so host code that reads it before waiting
// sees NaN, not old values. An async copy from pageable memory takes its source at the call and
// lands later, as CUDA stages it; one to pageable memory returns when done. CUDA_EMU_FAIL fails
// chosen calls (cuda_emu_faults.cc). One GPU of CUDA_EMU_MEMORY bytes (16 GiB), whose free memory
// (cudaMemGetInfo) is that less what cudaMalloc holds; nothing enforces it. What it cannot check: races
// between operations that happen to run in a safe order (CUDA_EMU_DELAY varies it), host code
// touching device memory while an operation runs, timing, registers, the real cuBLASLt (cuda_emu_cublaslt.cc reads the
// operands as cuBLASLt would, checks the layouts and the alignments promised to the heuristic, and
// multiplies with OpenBLAS).
#pragma once
#define ZOE_CUDA_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#undef __shared__
#define __shared__ static
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu {

struct Dims {
  dim3 grid, block;
  uint3 block_idx, thread_idx;
};
Dims& dims();

// `file` and `line` name the __syncthreads call: every live thread of a block must wait at the same
// one (a return address would not do: the compiler may duplicate a call into both arms of a branch).
void syncthreads(const char* file, int line);
// Exchanges v with lane (lane ^ offset) of the warp; both must call.
double shfl_xor(double v, int offset);
// The value of lane (lane + offset), or v itself where that is past the warp's last lane.
double shfl_down(double v, int offset);
float* dynamic_smem();
// One warp's mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, accumulating into d: every lane
// of the warp calls it with its fragments laid out as the PTX ISA lays them out ("Matrix Fragments
// for mma.m16n8k16 with floating point type"): a[4] (A, 16 x 16 bf16, two a register), b[2] (B,
// 16 x 8) and d[4] (D, 16 x 8 fp32). A warp short of a lane, or with a lane at another warp-wide
// operation, aborts: on a GPU the instruction's result would be undefined.
void mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b);

// Memory an operation reads or writes: [p, p + bytes).
struct Range {
  const char* p;
  size_t bytes;
  bool write;
};
// Runs body() once per thread of every block of the grid (kernel `name`, which declared `uses`).
void run_grid(dim3 grid, dim3 block, size_t smem_bytes, const char* name, const std::vector<Range>& uses,
              const std::function<void()>& body);
// An operation's use of "every allocation" (a kernel with an argument the emulation cannot see
// into, such as a struct of pointers); never part of a race check.
inline constexpr Range kAllMemory{nullptr, 0, false};
// A kernel's pointer arguments: const pointees are read, the others written (the block or
// allocation each points into; see cuda_emu_internal.h).
Range block_of(const void* p, bool write);
// A struct argument may hold pointers the emulation cannot see: unless the launcher declares its
// spans (ZOE_KERNEL_SPAN, as the fused Adam does), the kernel gets all device memory open
// (kAllMemory: no race check).
template <class P>
void note_argument(std::vector<Range>& uses, const P& v) {
  if constexpr (std::is_pointer_v<P>) {
    if (v) uses.push_back(block_of(v, !std::is_const_v<std::remove_pointer_t<P>>));
  } else if constexpr (std::is_class_v<P>) {
    uses.push_back(kAllMemory);
  }
}
// Spans the next kernel launched on this thread touches, declared by its launcher
// (ZOE_KERNEL_SPAN): then they, not the blocks its pointer arguments point into, are what the
// race check sees, so disjoint parts of one allocation (two units of a parameter array) do not race.
inline thread_local std::vector<Range> t_declared;
inline void declare_span(const void* p, size_t bytes, bool write) {
  t_declared.push_back({static_cast<const char*>(p), bytes, write});
}
// Queues a kernel's run on its stream (cuda_emu_streams.cc), or fails the launch as CUDA does
// (cudaGetLastError) where it breaks a limit: block and grid sizes, or dynamic shared memory above
// 48 KiB without cudaFuncSetAttribute's opt-in for `kernel`.
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* name, const void* kernel,
            std::vector<Range> uses, std::function<void()> run);

struct Launch {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  const char* name;
  template <class... P, class... A>
  void operator()(void (*kernel)(P...), A&&... args) const {
    // By value, as CUDA copies the arguments at launch.
    std::tuple<std::decay_t<P>...> bound(static_cast<P>(args)...);
    std::vector<Range> uses = std::move(t_declared);
    t_declared.clear();
    if (uses.empty()) std::apply([&](const auto&... v) { (note_argument(uses, v), ...); }, bound);
    const Launch l = *this;
    launch(grid, block, smem, stream, name, reinterpret_cast<const void*>(kernel), uses,
           [l, kernel, bound, uses] {
             run_grid(l.grid, l.block, l.smem, l.name, uses, [&] { std::apply(kernel, bound); });
           });
  }
};

template <class K>
struct Bound {
  Launch l;
  K* kernel;
  template <class... A>
  void operator()(A&&... args) const {
    l(kernel, std::forward<A>(args)...);
  }
};
template <class K>
Bound<K> bind(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* name, K* kernel) {
  return {{grid, block, smem, stream, name}, kernel};
}

}  // namespace emu

#define threadIdx (::emu::dims().thread_idx)
#define blockIdx (::emu::dims().block_idx)
#define blockDim (::emu::dims().block)
#define gridDim (::emu::dims().grid)
#define __syncthreads() ::emu::syncthreads(__FILE__, __LINE__)

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int offset) {
  return static_cast<T>(::emu::shfl_xor(static_cast<double>(v), offset));
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, int offset) {
  return static_cast<T>(::emu::shfl_down(static_cast<double>(v), offset));
}

// An atomic read-modify-write (std::atomic_ref: integers and, since C++20, floating point), so that
// it stays one however the emulation interleaves threads.
template <class T>
inline T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
}

// IEEE round-to-nearest arithmetic: the host's (x86-64 SSE, no contraction under -std=c++20).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
using std::isfinite;  // device code calls them unqualified
using std::isnan;
inline unsigned __float_as_uint(float f) {
  unsigned u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

#define ZOE_DYNAMIC_SMEM(name) float* name = ::emu::dynamic_smem()
#define ZOE_LAUNCH(grid, block, smem, stream, ...) \
  ::emu::bind(dim3(grid), dim3(block), (smem), (stream), #__VA_ARGS__, __VA_ARGS__)
#define ZOE_KERNEL_SPAN(p, bytes, write) ::emu::declare_span((p), (bytes), (write))
#define ZOE_MMA_M16N8K16_BF16(d, a, b) ::emu::mma_m16n8k16_bf16((d), (a), (b))

// Hooks for code built against the emulation (extern "C": callable from plain .cc files).
extern "C" {
// An allocator's block [p, p + bytes) is in use (in_use 1) or back in its cache (0): kernel
// arguments then stand for the block, not the whole cudaMalloc.
void cuda_emu_note_block(const void* p, size_t bytes, int in_use);
// Async copies so far that involved pageable host memory (synchronous, as on CUDA, and slow there).
unsigned long long cuda_emu_pageable_copies(void);
// Calls so far of one kind that the emulation can fail (cuda_emu_faults.cc: cudaEventSynchronize,
// launch, ...; "any" for all).
unsigned long long cuda_emu_calls(const char* kind);
// The next call of that kind fails, as CUDA_EMU_FAIL=<kind>:<the count so far + 1> would.
void cuda_emu_fail_next(const char* kind);
}

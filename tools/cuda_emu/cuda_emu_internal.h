// What the emulation's own files share (not seen by the code under test): the memory registry
// (cuda_emu_memory.cc), the stream workers (cuda_emu_streams.cc) and the fiber scheduler
// (cuda_emu_fibers.cc).
#pragma once
#include "cuda_emu.h"  // first: it defines the CUDA qualifiers before the CUDA headers do

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace emu {

// The emulated GPU's memory (cudaGetDeviceProperties, cudaMemGetInfo): CUDA_EMU_MEMORY bytes, 16
// GiB by default. Not enforced: cudaMalloc maps what it is asked for.
size_t total_global_mem();

[[noreturn]] void die(const std::string& m);
// Fault injection (cuda_emu_faults.cc, CUDA_EMU_FAIL): whether this call of kind `call` is one to
// fail; `detail` (may be null) names it further in the message (a kernel's name).
bool injected(const char* call, const char* detail = nullptr);
// Sets the calling thread's last error (cudaGetLastError) to e and returns it.
cudaError_t fail(cudaError_t e);

// --- kernel threads (cuda_emu_fibers.cc) and the race check inside a launch (cuda_emu_race.cc) ---
struct KernelThread {
  uint32_t block, thread;  // the block's linear index in the grid, the thread's in the block
  uint32_t block_epoch;    // __syncthreads its block has passed
  uint32_t warp_epoch;     // warp barriers (shuffles) its warp has passed
};
// The calling code is a kernel's thread (a fiber of a grid that runs on this OS thread).
bool in_kernel();
KernelThread current_thread();
// p is on a kernel thread's own stack (private to it).
bool on_fiber_stack(const void* p);
// p may be the running block's shared memory: its dynamic shared memory, or a static
// __shared__ variable (static_shared: the process's writable static data; the emulation's own
// thread-index state excluded).
bool maybe_shared(const void* p);
bool static_shared(const void* p);
// The running block writes static memory granule (address / 2) for the first time: kept aside
// while other blocks of the launch run (cuda_emu_fibers.cc).
void note_static_write(uintptr_t granule);
// The race check is on (kernels built with its hooks, CUDA_EMU_RACECHECK not 0): blocks of a
// launch interleave only then (their static __shared__ writes are noted only then).
bool race_checking();
// Under CUDA_EMU_SCHEDULE=chaos, now and then switches the calling kernel thread out.
void chaos_point();
// `uses`: what the launch declared (its pointer arguments' blocks, or ZOE_KERNEL_SPAN); a kernel
// that touches global memory outside them aborts (a span its launcher forgot hides a race).
void race_begin_launch(const char* name, const std::vector<Range>& uses);
// Block `linear` of the launch starts (its shared memory unwritten) or has ended.
void race_begin_block(uint32_t linear);
void race_end_block(uint32_t linear);
void race_end_launch();
// The [begin, end) of every cudaMalloc and pinned allocation now (global memory).
std::vector<std::pair<const char*, const char*>> global_ranges();

// --- memory (cuda_emu_memory.cc) ---
enum class Where { kDevice, kPinned, kPageable };
// Where p lives: cudaMalloc'd, pinned (cudaHostAlloc, cudaHostRegister), or plain host memory.
Where where(const void* p);
// The memory a kernel argument p stands for: its allocator block (cuda_emu_note_block), else its
// whole cudaMalloc / pinned allocation; bytes 0 where p is none of those (not checked).
Range block_of(const void* p, bool write);
// "a cudaMalloc of N bytes (byte K)" and the like, for messages.
std::string describe(const void* p);
// Opens (PROT_READ|WRITE) the pages of cudaMalloc allocations that `uses` touch (every allocation
// with kAllMemory) around an operation, and closes them (PROT_NONE) after it.
struct OpenedSpan {
  char* p;
  size_t bytes;
};
std::vector<OpenedSpan> open_device_memory(const std::vector<Range>& uses);
void close_device_memory(const std::vector<OpenedSpan>& opened, bool all);

// x rounded to bf16, to nearest with ties to even (NaN quieted), as a GPU rounds it: a bf16 D of
// cuBLASLt, a bf16 partial sum of NCCL (cuda_emu_cublaslt.cc).
uint16_t round_bf16(float x);

// --- streams (cuda_emu_streams.cc) ---
// Queues run() on stream s (0: the legacy default stream); `uses` are what it reads and writes,
// checked against the other streams' queued work now. exclusive: run() runs alone with device
// memory open; else it runs beside other operations and calls exclusive() to touch memory (an
// operation that blocks on other processes, such as an emulated NCCL call, must not hold up this
// process's other streams, as it would not on a GPU).
void enqueue(cudaStream_t s, std::string what, std::vector<Range> uses, std::function<void()> run,
             bool exclusive = true);
// Runs fn alone with the memory `uses` names open (all device memory when uses is null).
void exclusive(const std::function<void()>& fn, const std::vector<Range>* uses = nullptr);
// Blocks until everything queued on s so far has run.
void drain(cudaStream_t s);
// Whether queued work the host has not synchronized with writes some of [p, p + bytes); with
// `or_reads`, reads or writes it.
bool queued_writer(const void* p, size_t bytes, bool or_reads = false);
// Reports (and aborts) when an operation queued and not yet run uses [p, p + bytes): `what`
// names the call that wants the memory gone.
void check_unused(const char* what, const void* p, size_t bytes);

}  // namespace emu

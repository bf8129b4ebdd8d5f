// The emulation behind cuda_emu.h: fiber-scheduled blocks, the CUDA runtime calls src/gpu and its
// tests make, synchronous (memory is host memory; streams and events are tokens), a naive
// cuBLASLt, and one emulated GPU for gpu_info.cu.
#include "cuda_emu.h"  // first: it defines the CUDA qualifiers before the CUDA headers do

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>


namespace emu {
namespace {

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "cuda_emu: %s\n", m.c_str());
  std::abort();
}

enum State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  State state = kRunnable;
};

constexpr size_t kStackBytes = 256 * 1024;

Dims g_dims;
std::vector<Fiber> g_fibers;
int g_current = -1;
ucontext_t g_sched;
const std::function<void()>* g_body = nullptr;
std::vector<double> g_slots;  // one shuffle slot per thread
std::vector<float> g_smem;
// CUDA_EMU_SCHEDULE: ascending (default), alternating (ascending / descending phases, the last ready
// warp first), random.
const int g_schedule = [] {
  const char* e = std::getenv("CUDA_EMU_SCHEDULE");
  const std::string s = e ? e : "";
  return s == "alternating" ? 1 : s == "random" ? 2 : 0;
}();
std::mt19937 g_rng(12345);

void fiber_entry() {
  (*g_body)();
  g_fibers[g_current].state = kDone;
  // returning resumes uc_link (the scheduler)
}

void yield(State s) {
  Fiber& f = g_fibers[g_current];
  f.state = s;
  if (swapcontext(&f.ctx, &g_sched) != 0) die("swapcontext failed");
}

uint3 thread_of(int t, dim3 block) {
  uint3 u;
  u.x = t % block.x;
  u.y = (t / block.x) % block.y;
  u.z = t / (block.x * block.y);
  return u;
}

void run_block(int nthreads) {
  for (int t = 0; t < nthreads; t++) {
    Fiber& f = g_fibers[t];
    f.state = kRunnable;
    if (getcontext(&f.ctx) != 0) die("getcontext failed");
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &g_sched;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  const int nwarps = (nthreads + 31) / 32;
  std::vector<int> order(nthreads);
  for (int t = 0; t < nthreads; t++) order[t] = t;
  for (;;) {
    // Between two barriers threads run one after another in this order; a schedule other than
    // ascending exposes reads of shared memory that lack a barrier after the write.
    if (g_schedule == 1) std::reverse(order.begin(), order.end());
    if (g_schedule == 2) std::shuffle(order.begin(), order.end(), g_rng);
    for (int t : order) {
      if (g_fibers[t].state != kRunnable) continue;
      g_current = t;
      g_dims.thread_idx = thread_of(t, g_dims.block);
      if (swapcontext(&g_sched, &g_fibers[t].ctx) != 0) die("swapcontext failed");
    }
    int live = 0, at_block = 0;
    for (int t = 0; t < nthreads; t++) {
      live += g_fibers[t].state != kDone;
      at_block += g_fibers[t].state == kAtBlockBarrier;
    }
    if (live == 0) return;
    // A warp whose live lanes all wait at a shuffle goes on. One such warp at a time, and it runs
    // alone until it blocks again: warps drift apart as far as they legally can (to the next
    // __syncthreads), which exposes shared memory read from another warp without a barrier.
    std::vector<int> ready;
    for (int w = 0; w < nwarps; w++) {
      int wl = 0, ww = 0;
      for (int t = w * 32; t < std::min(nthreads, w * 32 + 32); t++) {
        wl += g_fibers[t].state != kDone;
        ww += g_fibers[t].state == kAtWarpBarrier;
      }
      if (ww > 0 && ww == wl) ready.push_back(w);
    }
    if (!ready.empty()) {
      const int w = g_schedule == 2 ? ready[g_rng() % ready.size()] : g_schedule == 1 ? ready.back() : ready.front();
      for (int t = w * 32; t < std::min(nthreads, w * 32 + 32); t++)
        if (g_fibers[t].state == kAtWarpBarrier) g_fibers[t].state = kRunnable;
      continue;
    }
    if (at_block == live) {
      for (int t = 0; t < nthreads; t++)
        if (g_fibers[t].state == kAtBlockBarrier) g_fibers[t].state = kRunnable;
      continue;
    }
    die("deadlock: threads of block (" + std::to_string(g_dims.block_idx.x) + "," +
        std::to_string(g_dims.block_idx.y) + ") wait at different barriers (" + std::to_string(at_block) +
        " of " + std::to_string(live) + " live threads at __syncthreads; the rest at a shuffle whose warp is split)");
  }
}

}  // namespace

Dims& dims() { return g_dims; }

void syncthreads() { yield(kAtBlockBarrier); }

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

// Device memory is closed to host code (PROT_NONE) except while a kernel, a copy or a GEMM runs:
// host code that reads or writes it faults, and the handler names the allocation.
struct DeviceAccess {
  DeviceAccess();
  ~DeviceAccess();
};

void run_grid(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body) {
  DeviceAccess open;
  const int nthreads = static_cast<int>(block.x * block.y * block.z);
  if (nthreads <= 0 || nthreads > 1024) die("bad block size " + std::to_string(nthreads));
  if (grid.y > 65535 || grid.z > 65535) die("grid y/z above 65535");
  if (smem_bytes > 227 * 1024) die("dynamic shared memory above 227 KiB: " + std::to_string(smem_bytes));
  if (g_fibers.size() < static_cast<size_t>(nthreads)) {
    g_fibers.resize(nthreads);
    for (Fiber& f : g_fibers) f.stack.resize(kStackBytes);
  }
  g_slots.assign(nthreads, 0.0);
  g_dims.grid = grid;
  g_dims.block = block;
  g_body = &body;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        g_dims.block_idx = uint3{x, y, z};
        g_smem.assign(smem_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
        run_block(nthreads);
      }
  g_body = nullptr;
}

}  // namespace emu

// ---- the CUDA runtime: device memory is host memory ------------------------------------------------

namespace {
cudaError_t g_last = cudaSuccess;
struct Alloc {
  size_t bytes, mapped;
};
std::map<char*, Alloc> g_allocs;  // device memory: base -> sizes
int g_open = 0;                   // DeviceAccess depth

void protect_all(int prot) {
  for (auto& [p, a] : g_allocs)
    if (mprotect(p, a.mapped, prot) != 0) emu::die("mprotect of device memory failed");
}

// The allocation holding p, or null.
const std::pair<char* const, Alloc>* device_alloc(const void* p) {
  auto* c = static_cast<const char*>(p);
  auto it = g_allocs.upper_bound(const_cast<char*>(c));
  if (it == g_allocs.begin()) return nullptr;
  --it;
  return c < it->first + it->second.mapped ? &*it : nullptr;
}

void on_segv(int, siginfo_t* si, void*) {
  if (auto* a = device_alloc(si->si_addr)) {
    char msg[200];
    const int n = std::snprintf(msg, sizeof msg,
                                "cuda_emu: host code touched device memory at %p (byte %zu of a cudaMalloc of %zu)\n",
                                si->si_addr, static_cast<size_t>(static_cast<char*>(si->si_addr) - a->first),
                                a->second.bytes);
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

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
  }
}

// A copy's kind must say where its pointers are (cudaMemcpyDefault: anywhere).
void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind != cudaMemcpyDefault && bytes > 0) {
    const bool d = device_alloc(dst) != nullptr, s = device_alloc(src) != nullptr;
    const bool want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (d != want_d || s != want_s)
      emu::die(std::string(kind_name(kind)) + " copies from " + (s ? "device" : "host") + " memory to " +
               (d ? "device" : "host") + " memory");
  }
  emu::DeviceAccess open;
  std::memmove(dst, src, bytes);
}
}  // namespace

namespace emu {
DeviceAccess::DeviceAccess() {
  if (g_open++ == 0) protect_all(PROT_READ | PROT_WRITE);
}
DeviceAccess::~DeviceAccess() {
  if (--g_open == 0) protect_all(PROT_NONE);
}
}  // namespace emu

extern "C" {

// Whole pages (so that they can be closed), NaN-filled: reading what was never written shows up.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  const size_t mapped = (bytes + 256 + 4095) / 4096 * 4096;
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return g_last = cudaErrorMemoryAllocation;
  auto* f = static_cast<float*>(m);
  for (size_t i = 0; i < mapped / sizeof(float); i++) f[i] = std::numeric_limits<float>::quiet_NaN();
  if (g_open == 0 && mprotect(m, mapped, PROT_NONE) != 0) emu::die("mprotect of device memory failed");
  g_allocs[static_cast<char*>(m)] = Alloc{bytes, mapped};
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  auto it = g_allocs.find(static_cast<char*>(p));
  if (it == g_allocs.end()) return g_last = cudaErrorInvalidValue;
  munmap(it->first, it->second.mapped);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  copy(dst, src, bytes, kind);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  copy(dst, src, bytes, kind);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int v, size_t bytes) {
  emu::DeviceAccess open;
  std::memset(dst, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int v, size_t bytes, cudaStream_t) {
  emu::DeviceAccess open;
  std::memset(dst, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last; }
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  static int dummy;
  *s = reinterpret_cast<cudaStream_t>(&dummy);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// ---- the runtime a CudaDevice uses, synchronous: every call has finished when it returns ----
// (streams and events are tokens; pinned and registered host memory is plain host memory.)
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
// One emulated GPU (gpu_info.cu's list_gpus reads it): an sm_90 with 16 GiB.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return g_last = cudaErrorInvalidDevice;
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "cuda_emu (CPU emulation)");
  p->totalGlobalMem = size_t{1} << 34;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 2;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : (g_last = cudaErrorInvalidDevice); }
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  return *p ? cudaSuccess : (g_last = cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void*, size_t, unsigned) { return cudaSuccess; }
cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
// A small GPU: two multiprocessors, one resident block each, so grid-stride loops take turns.
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return g_last = cudaErrorInvalidValue;
  *v = 2;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int, size_t, unsigned) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaFuncSetAttribute(const void*, enum cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize && value > 227 * 1024) return g_last = cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // extern "C"


// ---- cuBLASLt: a naive fp32 GEMM behind the same calls ---------------------------------------------

namespace {

struct DescData {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
struct LayoutData {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct PrefData {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};
struct AlgoData {
  uint32_t align[4];
};
static_assert(sizeof(DescData) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(LayoutData) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(PrefData) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(AlgoData) <= sizeof(cublasLtMatmulAlgo_t));

template <class D, class O>
D* data(O* o) {
  return reinterpret_cast<D*>(o);
}
int g_handle;

uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al) al >>= 1;
  return al;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(&g_handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasLtGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMU"; }
const char* cublasLtGetStatusString(cublasStatus_t) { return "emulated cuBLASLt error"; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  *d = new cublasLtMatmulDescOpaque_t{};
  auto* x = data<DescData>(*d);
  *x = DescData{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  auto* x = data<DescData>(d);
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) {
    if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &x->ta : &x->tb, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (ld < static_cast<int64_t>(rows)) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{};
  *data<LayoutData>(*l) = LayoutData{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  *data<PrefData>(*p) = PrefData{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  auto* x = data<PrefData>(p);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&x->workspace, buf, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&x->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
      return CUBLAS_STATUS_SUCCESS;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// Checks that the layouts make a product: op(A) m x k, op(B) k x n, C = D m x n.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
  const auto* o = data<DescData>(op);
  const auto *A = data<LayoutData>(a), *B = data<LayoutData>(b), *Cl = data<LayoutData>(c), *Dl = data<LayoutData>(d);
  if (o->compute != CUBLAS_COMPUTE_32F && o->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t m = Dl->rows, n = Dl->cols;
  const uint64_t am = o->ta == CUBLAS_OP_N ? A->rows : A->cols, ak = o->ta == CUBLAS_OP_N ? A->cols : A->rows;
  const uint64_t bk = o->tb == CUBLAS_OP_N ? B->rows : B->cols, bn = o->tb == CUBLAS_OP_N ? B->cols : B->rows;
  // The products zoe asks for: fp32 x fp32 or bf16 x bf16, into fp32 (as cuBLASLt's tables allow).
  const bool types_ok = A->type == B->type && (A->type == CUDA_R_32F || A->type == CUDA_R_16BF) &&
                        Cl->type == CUDA_R_32F && Dl->type == CUDA_R_32F &&
                        (A->type == CUDA_R_32F || o->compute == CUBLAS_COMPUTE_32F);
  if (!types_ok) {
    *found = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (am != m || bn != n || ak != bk || Cl->rows != m || Cl->cols != n || requested < 1) {
    *found = 0;
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::memset(results, 0, sizeof *results);
  std::memcpy(data<AlgoData>(&results->algo)->align, data<PrefData>(pref)->align, sizeof(uint32_t) * 4);
  results->state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha_p, const void* Ap,
                              cublasLtMatrixLayout_t a, const void* Bp, cublasLtMatrixLayout_t b, const void* beta_p,
                              const void* Cp, cublasLtMatrixLayout_t c, void* Dp, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t) {
  emu::DeviceAccess open;
  const auto* o = data<DescData>(op);
  const auto *A = data<LayoutData>(a), *B = data<LayoutData>(b), *Cl = data<LayoutData>(c), *Dl = data<LayoutData>(d);
  const auto* al = data<AlgoData>(const_cast<cublasLtMatmulAlgo_t*>(algo))->align;
  const void* ptrs[4] = {Ap, Bp, Cp, Dp};
  for (int i = 0; i < 4; i++)
    if (alignment(ptrs[i]) < al[i]) {
      std::fprintf(stderr, "cuda_emu: matrix %c is %u-byte aligned, the plan promised %u\n", "ABCD"[i],
                   alignment(ptrs[i]), al[i]);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  const float alpha = *static_cast<const float*>(alpha_p), beta = *static_cast<const float*>(beta_p);
  // Element x of a matrix of `type` (fp32, or bf16 widened exactly).
  auto load = [](const void* p, cudaDataType_t type, int64_t x) {
    if (type == CUDA_R_16BF) {
      uint32_t u = uint32_t{static_cast<const uint16_t*>(p)[x]} << 16;
      float f;
      std::memcpy(&f, &u, sizeof f);
      return f;
    }
    return static_cast<const float*>(p)[x];
  };
  const auto* Cf = static_cast<const float*>(Cp);
  auto* Df = static_cast<float*>(Dp);
  const int64_t m = Dl->rows, n = Dl->cols;
  const int64_t k = o->ta == CUBLAS_OP_N ? A->cols : A->rows;
  auto at = [&](int64_t i, int64_t p) { return load(Ap, A->type, o->ta == CUBLAS_OP_N ? p * A->ld + i : i * A->ld + p); };
  auto bt = [&](int64_t p, int64_t j) { return load(Bp, B->type, o->tb == CUBLAS_OP_N ? j * B->ld + p : p * B->ld + j); };
  std::vector<float> col(m);
  for (int64_t j = 0; j < n; j++) {
    for (int64_t i = 0; i < m; i++) {
      float acc = 0.f;
      for (int64_t p = 0; p < k; p++) acc += at(i, p) * bt(p, j);
      col[i] = alpha * acc + (beta != 0.f ? beta * Cf[j * Cl->ld + i] : 0.f);
    }
    for (int64_t i = 0; i < m; i++) Df[j * Dl->ld + i] = col[i];
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

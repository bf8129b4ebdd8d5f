// Asynchronous streams: each stream is a worker thread that runs its queue in order, after the
// host enqueued it (CUDA_EMU_DELAY=<max microseconds>: a random sleep before each operation).
// Events are (stream, count of operations queued at the record); a stream wait is a queue entry
// that blocks its worker until that count has run. One operation executes at a time (the fiber
// scheduler and the memory protection are process-wide), with device memory open.
//
// The legacy default stream (0) is modelled: its work waits for all earlier work of blocking
// streams (cudaStreamCreate), and theirs for its. Non-blocking streams do not sync with it.
//
// Races are found when work is queued, whatever order the workers then run it in: each stream
// carries a vector clock (how far into every stream its next operation is ordered: program
// order, stream waits on events, the legacy stream's syncs, and what the host has synchronized
// with), and the memory each queued operation read or wrote is kept until the host has
// synchronized past it. A new operation that uses memory an unordered operation of another
// stream used, one of them writing, is a race: a missing event wait, or memory handed to new
// work before its last user finished. Freeing memory that such work uses is reported the same way.
#include "cuda_emu_internal.h"  // first: cuda_emu.h defines the CUDA qualifiers before the CUDA headers do

#include <execinfo.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace emu {
struct Op;
}

namespace emu {
using Clock = std::vector<uint64_t>;  // per stream id: operations known to have been queued before
}

struct CUstream_st {
  int id = 0;
  emu::Clock vc;  // what the next operation queued here is ordered after
  bool blocking = true;  // syncs with the legacy default stream
  std::deque<std::shared_ptr<emu::Op>> queue;
  uint64_t queued = 0, done = 0;  // operations ever queued / run
  bool stop = false;
  std::thread worker;
  std::vector<CUevent_st*> stamping;  // timing events recorded here, stamped when done reaches them
};

struct CUevent_st {
  CUstream_st* stream = nullptr;  // null: never recorded
  uint64_t count = 0;             // stream->queued at the record
  emu::Clock vc;                  // stream->vc at the record
  bool timing = true;             // not cudaEventDisableTiming
  bool stamped = false;           // the stream reached the record: `at` is when
  std::chrono::steady_clock::time_point at;
};

namespace emu {

struct Op {
  CUstream_st* stream = nullptr;
  std::string what;
  std::vector<Range> uses;
  std::function<void()> run;
  bool exclusive = true;  // run alone with device memory open (else run calls exclusive() itself)
  CUstream_st* wait_stream = nullptr;  // a stream wait: until wait_stream->done >= wait_count
  uint64_t wait_count = 0;
};

namespace {

// Never destroyed: workers are still waiting on them while the process exits.
std::mutex& g_mu = *new std::mutex;  // queues, counters, pending, streams
std::condition_variable& g_cv = *new std::condition_variable;
std::mutex& g_exec = *new std::mutex;  // held while an operation executes
std::vector<CUstream_st*>& g_streams = *new std::vector<CUstream_st*>;
// A queued operation's use of memory, kept until the host has synchronized past it.
struct Access {
  Range r;
  int stream;
  uint64_t index;  // the operation's position in its stream
  std::shared_ptr<const std::string> what;
};
std::deque<Access>& g_history = *new std::deque<Access>;
Clock& g_host = *new Clock;  // what host code has synchronized with
unsigned long long g_pageable = 0;
// Said at exit: on a GPU each of them stalls the host while the driver stages the bytes.
[[maybe_unused]] const int g_pageable_report = std::atexit([] {
  if (g_pageable > 0)
    std::fprintf(stderr,
                 "cuda_emu: %llu async copies involved pageable host memory (synchronous, and slow on a GPU; "
                 "CUDA_EMU_PAGEABLE_TRACE=1 names their callers)\n",
                 g_pageable);
});
thread_local cudaError_t t_last = cudaSuccess;

const unsigned g_delay_us = [] {
  const char* e = std::getenv("CUDA_EMU_DELAY");
  return e ? static_cast<unsigned>(std::strtoul(e, nullptr, 10)) : 0u;
}();

std::string stream_name(const CUstream_st* s) { return s->id == 0 ? "the legacy stream" : "stream " + std::to_string(s->id); }

bool overlap(const Range& a, const Range& b) {
  return a.bytes && b.bytes && (a.write || b.write) && a.p < b.p + b.bytes && b.p < a.p + a.bytes;
}
void merge(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); i++) into[i] = std::max(into[i], from[i]);
}
bool ordered(const Clock& vc, int stream, uint64_t index) {
  return static_cast<size_t>(stream) < vc.size() && vc[stream] >= index;
}
CUstream_st* stream_by_id(int id) { return g_streams[id]; }

// Under g_mu: op, just numbered on its stream, against the memory unordered work used.
void check_races(const Op& op, uint64_t index) {
  const CUstream_st* s = op.stream;
  for (const Access& h : g_history) {
    if (h.stream == s->id || ordered(s->vc, h.stream, h.index)) continue;
    for (const Range& a : op.uses)
      if (overlap(a, h.r))
        die("race on " + describe(std::max(a.p, h.r.p)) + ": " + op.what + " on " + stream_name(s) +
            (a.write ? " writes it" : " reads it") + ", and " + *h.what + " on " + stream_name(stream_by_id(h.stream)) +
            (h.r.write ? " writes it" : " reads it") +
            " with no event ordering them: a missing stream wait, or memory given to new work before its last "
            "user finished");
  }
  auto what = std::make_shared<const std::string>(op.what);
  for (const Range& a : op.uses)
    if (a.bytes) g_history.push_back(Access{a, s->id, index, what});
}

// Under g_mu: the host knows everything vc covers has run; later work is ordered after it.
void host_knows(const Clock& vc) {
  merge(g_host, vc);
  std::erase_if(g_history, [](const Access& h) { return ordered(g_host, h.stream, h.index); });
}

}  // namespace
void exclusive(const std::function<void()>& fn, const std::vector<Range>* uses);
namespace {

void execute(Op& op) {
  if (op.wait_stream) {
    std::unique_lock<std::mutex> lock(g_mu);
    g_cv.wait(lock, [&] { return op.wait_stream->done >= op.wait_count; });
    return;
  }
  if (op.exclusive) exclusive(op.run, &op.uses);
  else op.run();
}

// Under g_mu: the timing events s has reached get their time.
void stamp_reached(CUstream_st* s) {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(s->stamping, [&](CUevent_st* e) {
    if (e->count > s->done) return false;
    e->stamped = true;
    e->at = now;
    return true;
  });
}

// Under g_mu: e leaves the list of the stream that was to stamp it.
void stop_stamping(CUevent_st* e) {
  if (e->stream) std::erase(e->stream->stamping, e);
}

void work(CUstream_st* s) {
  std::mt19937 rng(static_cast<unsigned>(s->id) * 7919u + 17u);
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(g_mu);
      g_cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
      if (s->queue.empty()) return;
      op = s->queue.front();
    }
    if (g_delay_us) std::this_thread::sleep_for(std::chrono::microseconds(rng() % g_delay_us));
    execute(*op);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      s->queue.pop_front();
      s->done++;
      stamp_reached(s);
    }
    g_cv.notify_all();
  }
}

CUstream_st* new_stream(bool blocking) {
  auto* s = new CUstream_st;
  std::lock_guard<std::mutex> lock(g_mu);
  s->id = static_cast<int>(g_streams.size());
  s->blocking = blocking;
  g_streams.push_back(s);
  s->worker = std::thread(work, s);
  return s;
}

CUstream_st* legacy() {
  static CUstream_st* s = new_stream(false);  // g_streams[0]; syncs by the rules in push()
  return s;
}

CUstream_st* of(cudaStream_t s) { return s && s != cudaStreamLegacy ? s : legacy(); }

// Under g_mu: queues op on s, ordered after what the host knows, and checks its memory.
void push(CUstream_st* s, std::shared_ptr<Op> op) {
  op->stream = s;
  merge(s->vc, g_host);
  s->queued++;
  if (s->vc.size() <= static_cast<size_t>(s->id)) s->vc.resize(s->id + 1, 0);
  check_races(*op, s->queued);
  s->vc[s->id] = s->queued;
  s->queue.push_back(std::move(op));
}
// Under g_mu: s goes on once `count` operations of `on` have run (vc: on's clock then).
void push_wait(CUstream_st* s, CUstream_st* on, uint64_t count, const Clock& vc) {
  if (on == s) return;
  merge(s->vc, vc);
  if (on->done >= count) return;
  auto w = std::make_shared<Op>();
  w->what = "a wait for " + stream_name(on);
  w->wait_stream = on;
  w->wait_count = count;
  push(s, std::move(w));
}

// Blocks until `count` operations of s have run; the host then knows vc.
void wait_for(CUstream_st* s, uint64_t count, const Clock& vc) {
  std::unique_lock<std::mutex> lock(g_mu);
  g_cv.wait(lock, [&] { return s->done >= count; });
  host_knows(vc);
}

}  // namespace

cudaError_t fail(cudaError_t e) { return t_last = e; }

void exclusive(const std::function<void()>& fn, const std::vector<Range>* uses) {
  static const std::vector<Range> all = {kAllMemory};
  const std::vector<Range>& u = uses ? *uses : all;
  bool every = false;
  for (const Range& r : u) every |= r.p == nullptr;
  std::lock_guard<std::mutex> exec(g_exec);
  const std::vector<OpenedSpan> opened = open_device_memory(u);
  fn();
  close_device_memory(opened, every);
}

void enqueue(cudaStream_t stream, std::string what, std::vector<Range> uses, std::function<void()> run,
             bool exclusive) {
  CUstream_st* s = of(stream);
  auto op = std::make_shared<Op>();
  op->what = std::move(what);
  op->uses = std::move(uses);
  op->run = std::move(run);
  op->exclusive = exclusive;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (s->id == 0) {
      for (CUstream_st* b : g_streams)
        if (b->blocking) push_wait(s, b, b->queued, b->vc);
    } else if (s->blocking) {
      push_wait(s, g_streams[0], g_streams[0]->queued, g_streams[0]->vc);
    }
    push(s, std::move(op));
  }
  g_cv.notify_all();
}

void drain(cudaStream_t stream) {
  CUstream_st* s = of(stream);
  uint64_t count;
  Clock vc;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    count = s->queued;
    vc = s->vc;
  }
  wait_for(s, count, vc);
}

bool queued_writer(const void* p, size_t bytes, bool or_reads) {
  std::lock_guard<std::mutex> lock(g_mu);
  const Range r{static_cast<const char*>(p), bytes, or_reads};  // (overlap() pairs a write with any use)
  for (const Access& h : g_history)
    if ((h.r.write || or_reads) && overlap(r, h.r)) return true;
  for (const CUstream_st* st : g_streams)  // a queued kernel open to all memory (kAllMemory) may write it
    for (const auto& op : st->queue)
      for (const Range& u : op->uses)
        if (u.p == nullptr) return true;
  return false;
}

void check_unused(const char* what, const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  const Range freed{static_cast<const char*>(p), bytes, true};
  for (const Access& h : g_history)
    if (overlap(freed, h.r))
      die(std::string(what) + " of " + describe(p) + " while " + *h.what + " on " + stream_name(stream_by_id(h.stream)) +
          ", which the host has not synchronized with, uses it");
}

// The opt-ins cudaFuncSetAttribute gave: kernel -> the most dynamic shared memory it may use.
std::mutex& g_smem_mu = *new std::mutex;
std::map<const void*, size_t>& g_smem_optin = *new std::map<const void*, size_t>;
constexpr size_t kDefaultSmem = 48 * 1024, kMaxSmem = 227 * 1024;  // sm_90's limits per block

// A launch CUDA refuses: said on stderr (CUDA only sets the error) and failed with `e`.
void refuse(cudaError_t e, const std::string& why) {
  std::fprintf(stderr, "cuda_emu: launch refused: %s\n", why.c_str());
  fail(e);
}

void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* name, const void* kernel,
            std::vector<Range> uses, std::function<void()> run) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const std::string dims = " (grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                           std::to_string(grid.z) + ", block " + std::to_string(block.x) + "x" +
                           std::to_string(block.y) + "x" + std::to_string(block.z) + ")";
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    return refuse(cudaErrorInvalidConfiguration, std::string(name) + ": a block of 1 to 1024 threads, z at most 64" + dims);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return refuse(cudaErrorInvalidConfiguration, std::string(name) + ": grid x 1 to 2^31-1, y and z 1 to 65535" + dims);
  size_t allowed = kDefaultSmem;
  {
    std::lock_guard<std::mutex> lock(g_smem_mu);
    if (auto it = g_smem_optin.find(kernel); it != g_smem_optin.end()) allowed = std::max(allowed, it->second);
  }
  if (smem > allowed)
    return refuse(cudaErrorInvalidValue, std::string(name) + ": " + std::to_string(smem) +
                                             " bytes of dynamic shared memory, above the " + std::to_string(allowed) +
                                             " allowed (48 KiB without cudaFuncSetAttribute's "
                                             "cudaFuncAttributeMaxDynamicSharedMemorySize opt-in)");
  if (injected("launch", name)) {
    fail(cudaErrorLaunchOutOfResources);
    return;
  }
  enqueue(stream, std::string("kernel ") + name, std::move(uses), std::move(run));
}

}  // namespace emu

namespace {

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
  }
}

// How a copy is queued: `staged` takes the source now (a pageable source, which CUDA copies into
// its own pinned staging memory before the call returns), else the copy reads it when it runs.
enum class Source { kAtRun, kStaged };

// Pinned host memory a queued copy (or memset) reads or writes must not change before it runs:
// CUDA reads and writes it then, not at the call, so a host write (or an NVMe read landing) in
// between is a race the streams' check cannot see (host code is no stream). The bytes are kept at
// the call and compared when the operation runs. Not where queued work that the host has not
// synchronized with writes them: that work may legitimately change them first.
struct PinnedGuard {
  const char* p = nullptr;
  std::vector<char> was;
  bool destination = false;
};
std::vector<PinnedGuard> guard_pinned(const void* dst, const void* src, size_t bytes) {
  std::vector<PinnedGuard> guards;
  for (const auto& [p, destination] : {std::pair{static_cast<const char*>(src), false},
                                       std::pair{static_cast<const char*>(dst), true}}) {
    if (bytes == 0 || !p || emu::where(p) != emu::Where::kPinned || emu::queued_writer(p, bytes)) continue;
    guards.push_back({p, std::vector<char>(p, p + bytes), destination});
  }
  return guards;
}
// op: what the queued operation is ("copy", "memset").
void check_pinned(const std::vector<PinnedGuard>& guards, const std::string& what, const char* op = "copy") {
  for (const PinnedGuard& g : guards) {
    if (std::memcmp(g.p, g.was.data(), g.was.size()) == 0) continue;
    size_t at = 0;
    while (g.p[at] == g.was[at]) at++;
    emu::die("pinned host memory changed between the call and the run of " + what + ": " + emu::describe(g.p + at) +
             ", which the " + op + " " + (g.destination ? "writes" : "reads") +
             ", was written by host code (or an NVMe read) before the " + op + " ran: a missing wait for the " + op +
             ", or its buffer handed to new work before the " + op + " finished (CUDA " +
             (g.destination ? "writes" : "reads") + " pinned memory when the " + op + " runs, not at the call)");
  }
}

// A copy into pinned host memory writes it when the copy runs, which may be at once or much later:
// until the host has waited for it, the destination holds nothing the host may read. The bytes
// are poisoned at the call (0xff: NaN as fp32 and bf16, -1 as an int), so that host code reading
// them too early (a missing wait for a device-to-host copy) computes with NaN instead of last
// time's values, which a GPU may or may not still hold. Not where queued work the host has not
// synchronized with uses them (an earlier copy may still read them).
void poison_pinned_destination(void* dst, size_t bytes) {
  if (bytes == 0 || !dst || emu::where(dst) != emu::Where::kPinned) return;
  if (emu::queued_writer(dst, bytes, /*or_reads=*/true)) return;
  std::memset(dst, 0xff, bytes);
}

// Queues a copy after checking that its kind says where its pointers are (cudaMemcpyDefault:
// anywhere).
void queue_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s, const char* call,
                Source source = Source::kAtRun) {
  const emu::Where wd = emu::where(dst), ws = emu::where(src);
  if (kind != cudaMemcpyDefault && bytes > 0) {
    const bool d = wd == emu::Where::kDevice, sd = ws == emu::Where::kDevice;
    const bool want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (d != want_d || sd != want_s)
      emu::die(std::string(kind_name(kind)) + " copies from " + (sd ? "device" : "host") + " memory to " +
               (d ? "device" : "host") + " memory");
  }
  const std::string what = std::string(call) + " of " + std::to_string(bytes) + " bytes";
  if (source == Source::kStaged) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    emu::enqueue(s, what + " (staged from pageable memory)", {{static_cast<const char*>(dst), bytes, true}},
                 [=] {
                   if (bytes) std::memcpy(dst, staged->data(), bytes);
                 });
    return;
  }
  if (src != dst) poison_pinned_destination(dst, bytes);
  auto guards = std::make_shared<const std::vector<PinnedGuard>>(guard_pinned(dst, src, bytes));
  emu::enqueue(s, what, {{static_cast<const char*>(dst), bytes, true}, {static_cast<const char*>(src), bytes, false}},
               [=] {
                 check_pinned(*guards, what);
                 if (bytes) std::memmove(dst, src, bytes);  // (a null pointer is allowed for 0 bytes)
               });
}

}  // namespace

extern "C" {

unsigned long long cuda_emu_pageable_copies(void) {
  std::lock_guard<std::mutex> lock(emu::g_mu);
  return emu::g_pageable;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = emu::t_last;
  emu::t_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return emu::t_last; }
// The codes the emulation returns, named as CUDA names them.
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorEmulated";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }

// --- copies: synchronous ones on the legacy stream, waited for ---
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (emu::injected("cudaMemcpy")) return emu::fail(cudaErrorLaunchFailure);
  queue_copy(dst, src, bytes, kind, nullptr, "cudaMemcpy");
  emu::drain(nullptr);
  return cudaSuccess;
}
// From or to pageable memory CUDA stages the copy and returns when it is done: counted, since a
// GPU does that slowly.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (emu::injected("cudaMemcpyAsync")) return emu::fail(cudaErrorInvalidValue);
  const bool from_pageable = emu::where(src) == emu::Where::kPageable;
  const bool to_pageable = emu::where(dst) == emu::Where::kPageable;
  if (!from_pageable && !to_pageable) {
    queue_copy(dst, src, bytes, kind, s, "cudaMemcpyAsync");
    return cudaSuccess;
  }
  {
    std::lock_guard<std::mutex> lock(emu::g_mu);
    emu::g_pageable++;
  }
  if (std::getenv("CUDA_EMU_PAGEABLE_TRACE")) {  // who makes them (a debugging aid)
    void* frames[8];
    backtrace_symbols_fd(frames, backtrace(frames, 8), 2);
  }
  if (to_pageable) {  // CUDA returns once the copy is done: the host then knows it ran
    queue_copy(dst, src, bytes, kind, s, "cudaMemcpyAsync");
    emu::drain(s);
    return cudaSuccess;
  }
  // From pageable memory CUDA waits for the stream's earlier work, takes the source into staging
  // memory and returns; the copy itself is still queued: the host does not know when it lands.
  emu::drain(s);
  queue_copy(dst, src, bytes, kind, s, "cudaMemcpyAsync", Source::kStaged);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int v, size_t bytes) {
  if (emu::injected("cudaMemset")) return emu::fail(cudaErrorLaunchFailure);
  emu::enqueue(nullptr, "cudaMemset", {{static_cast<const char*>(dst), bytes, true}},
               [=] {
                 if (bytes) std::memset(dst, v, bytes);
               });
  emu::drain(nullptr);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int v, size_t bytes, cudaStream_t s) {
  if (emu::injected("cudaMemsetAsync")) return emu::fail(cudaErrorInvalidValue);
  // A memset of pinned host memory: host code must not write it before the memset runs (the
  // memset would undo that write on a GPU, whenever it happens to run).
  auto guards = std::make_shared<const std::vector<PinnedGuard>>(guard_pinned(dst, nullptr, bytes));
  const std::string what = "cudaMemsetAsync of " + std::to_string(bytes) + " bytes";
  emu::enqueue(s, "cudaMemsetAsync", {{static_cast<const char*>(dst), bytes, true}},
               [=] {
                 check_pinned(*guards, what, "memset");
                 if (bytes) std::memset(dst, v, bytes);
               });
  return cudaSuccess;
}

// --- streams and events ---
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  if (emu::injected("cudaStreamCreate")) return emu::fail(cudaErrorMemoryAllocation);
  emu::legacy();  // the legacy stream exists first (id 0)
  *s = emu::new_stream(true);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (emu::injected("cudaStreamCreateWithFlags")) return emu::fail(cudaErrorMemoryAllocation);
  emu::legacy();
  *s = emu::new_stream(!(flags & cudaStreamNonBlocking));
  return cudaSuccess;
}
// Waits for the queue, then ends the worker; the stream itself stays allocated, since events
// and other streams' waits may still name it.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s || s == cudaStreamLegacy) return emu::fail(cudaErrorInvalidResourceHandle);
  emu::drain(s);
  {
    std::lock_guard<std::mutex> lock(emu::g_mu);
    s->stop = true;
    s->blocking = false;
  }
  emu::g_cv.notify_all();
  s->worker.join();
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (emu::injected("cudaStreamSynchronize")) return emu::fail(cudaErrorLaunchFailure);
  emu::drain(s);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  if (emu::injected("cudaDeviceSynchronize")) return emu::fail(cudaErrorLaunchFailure);
  std::vector<CUstream_st*> all;
  {
    std::lock_guard<std::mutex> lock(emu::g_mu);
    all = emu::g_streams;
  }
  for (CUstream_st* s : all) emu::drain(s);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (emu::injected("cudaEventCreateWithFlags")) return emu::fail(cudaErrorMemoryAllocation);
  *e = new CUevent_st;
  (*e)->timing = (flags & cudaEventDisableTiming) == 0;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e) {
    std::lock_guard<std::mutex> lock(emu::g_mu);
    emu::stop_stamping(e);
  }
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return emu::fail(cudaErrorInvalidResourceHandle);
  if (emu::injected("cudaEventRecord")) return emu::fail(cudaErrorLaunchFailure);
  CUstream_st* st = emu::of(s);
  std::lock_guard<std::mutex> lock(emu::g_mu);
  emu::stop_stamping(e);
  e->stream = st;
  e->count = st->queued;
  e->vc = st->vc;
  e->stamped = false;
  if (e->timing) {  // the time the stream reaches the record: now, if it has already
    st->stamping.push_back(e);
    emu::stamp_reached(st);
  }
  return cudaSuccess;
}
// As CUDA: both events made with timing and recorded, else an invalid handle; the end not reached
// yet, not ready. The time between the moments their stream reached them (emulated: wall time).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return emu::fail(!ms ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(emu::g_mu);
  if (!start->timing || !end->timing || !start->stream || !end->stream)
    return emu::fail(cudaErrorInvalidResourceHandle);
  if (!start->stamped || !end->stamped) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return emu::fail(cudaErrorInvalidResourceHandle);
  if (emu::injected("cudaEventSynchronize")) return emu::fail(cudaErrorLaunchFailure);
  CUstream_st* s;
  uint64_t count;
  emu::Clock vc;
  {
    std::lock_guard<std::mutex> lock(emu::g_mu);
    s = e->stream;
    count = e->count;
    vc = e->vc;
  }
  if (s) emu::wait_for(s, count, vc);  // never recorded: nothing to wait for, as on CUDA
  return cudaSuccess;
}
// Not a failable call: a query that is not ready is no error (and sets none).
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return emu::fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(emu::g_mu);
  if (!e->stream) return cudaSuccess;  // never recorded
  if (e->stream->done < e->count) return cudaErrorNotReady;
  emu::host_knows(e->vc);  // the host learns that the work ran, as after a wait
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return emu::fail(cudaErrorInvalidResourceHandle);
  if (emu::injected("cudaStreamWaitEvent")) return emu::fail(cudaErrorLaunchFailure);
  CUstream_st* st = emu::of(s);
  {
    std::lock_guard<std::mutex> lock(emu::g_mu);
    if (e->stream) emu::push_wait(st, e->stream, e->count, e->vc);  // the record as of now, as on CUDA
  }
  emu::g_cv.notify_all();
  return cudaSuccess;
}

// --- one emulated GPU (gpu_info.cu's list_gpus reads it): an sm_90 with 16 GiB ---
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return emu::fail(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "cuda_emu (CPU emulation)");
  p->totalGlobalMem = emu::total_global_mem();
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 2;
  return cudaSuccess;
}
// No PCI device stands behind the emulated GPU.
cudaError_t cudaDeviceGetPCIBusId(char*, int, int) { return emu::fail(cudaErrorNotSupported); }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : emu::fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
// A small GPU: two multiprocessors, one resident block each, so grid-stride loops take turns.
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return emu::fail(cudaErrorInvalidValue);
  *v = 2;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int, size_t, unsigned) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* kernel, enum cudaFuncAttribute attr, int value) {
  if (emu::injected("cudaFuncSetAttribute")) return emu::fail(cudaErrorInvalidValue);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (!kernel || value < 0 || static_cast<size_t>(value) > emu::kMaxSmem) return emu::fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(emu::g_smem_mu);
  emu::g_smem_optin[kernel] = static_cast<size_t>(value);
  return cudaSuccess;
}

}  // extern "C"

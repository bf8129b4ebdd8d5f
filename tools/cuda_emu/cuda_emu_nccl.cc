// NCCL for the emulation: a communicator is a duplicate of MPI_COMM_WORLD (the ranks are MPI
// processes, one emulated GPU each; one rank needs no MPI). A call is queued on its stream like
// a kernel and runs on that stream's worker in queue order: it copies what it sends out of
// device memory (alone, as any operation), moves it with MPI without holding up this process's
// other streams (a GPU runs them meanwhile, and waiting for another rank while holding them could
// deadlock where a GPU would not), then copies what it received in.
//
// Before it moves data every call checks, with its peers, that each rank issues the same call as
// its n-th on the communicator (kind and byte count): a call order that differs between ranks is
// reported naming both calls, where real NCCL would hang or mix up data. Point-to-point calls
// between ncclGroupStart/End are one call; their sizes are checked by MPI's matching receives.
#include "cuda_emu_internal.h"  // first: cuda_emu.h defines the CUDA qualifiers before the CUDA headers do

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;  // null for one rank
  int rank = 0, size = 1;
  uint64_t issued = 0;  // calls queued (the sequence number of the next)
  std::mutex mu;
  std::condition_variable cv;
  uint64_t finished = 0;  // calls run
};

namespace {

thread_local std::string t_last_error;

ncclResult_t error(ncclResult_t r, const std::string& why) {
  t_last_error = why;
  return r;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// One call as the ranks compare it.
struct Signature {
  uint64_t seq;
  char what[64];
  uint64_t bytes;
};

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, msg, &n);
  emu::die(std::string("emulated NCCL: ") + call + " failed: " + std::string(msg, n));
}

// Waits for the requests as a GPU waits for its peers, without holding a core: MPI's own wait
// spins, and a stream worker spinning for a slower rank took the core that rank's emulated
// kernels needed (2 ranks on 2 cores). Sleeps of 20 us growing to 200 us between tests.
void wait_all(std::vector<MPI_Request>& reqs, MPI_Status* statuses, const char* call) {
  std::chrono::microseconds nap(20);
  for (;;) {
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, statuses), call);
    if (flag) return;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
}

// MPI_Allgather of `bytes` from each rank, waited for as above.
void all_gather(ncclComm* c, const void* mine, void* all, size_t bytes) {
  std::vector<MPI_Request> req(1);
  const int n = static_cast<int>(bytes);
  check_mpi(MPI_Iallgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, c->mpi, req.data()), "MPI_Iallgather");
  wait_all(req, MPI_STATUSES_IGNORE, "MPI_Iallgather");
}

// Every rank's n-th call on comm must be the same call (see the top of this file).
void agree(ncclComm* c, const Signature& mine) {
  if (c->size == 1) return;
  std::vector<Signature> all(c->size);
  all_gather(c, &mine, all.data(), sizeof mine);
  for (int r = 0; r < c->size; r++)
    if (std::strcmp(all[r].what, mine.what) != 0 || all[r].bytes != mine.bytes)
      emu::die("NCCL call order differs between ranks: call " + std::to_string(mine.seq) + " on the communicator is " +
               mine.what + " of " + std::to_string(mine.bytes) + " bytes on rank " + std::to_string(c->rank) +
               " but " + all[r].what + " of " + std::to_string(all[r].bytes) + " bytes on rank " + std::to_string(r));
}

// Queues body on stream as call number comm->issued.
void queue_call(ncclComm* c, cudaStream_t stream, const char* what, uint64_t bytes, std::vector<emu::Range> uses,
                std::function<void()> body) {
  Signature sig{0, {}, bytes};
  {
    std::lock_guard<std::mutex> lock(c->mu);
    sig.seq = c->issued++;
  }
  std::snprintf(sig.what, sizeof sig.what, "%s", what);
  emu::enqueue(stream, what, std::move(uses), [c, sig, body] {
    agree(c, sig);
    body();
    std::lock_guard<std::mutex> lock(c->mu);
    c->finished++;
    c->cv.notify_all();
  }, /*exclusive=*/false);
}

// Open groups of point-to-point calls (ncclGroupStart), per thread as in NCCL.
struct P2p {
  bool send;
  char* buf;
  size_t bytes;
  int peer;
  ncclComm* comm;
  cudaStream_t stream;
};
thread_local int t_group_depth = 0;
thread_local std::vector<P2p> t_group;

void run_group(const std::vector<P2p>& ops) {
  ncclComm* c = ops.front().comm;
  std::vector<std::vector<char>> staged(ops.size());
  std::vector<emu::Range> sent, received;  // what the copies in and out touch (exclusive() opens it)
  for (const P2p& o : ops) (o.send ? sent : received).push_back({o.buf, o.bytes, !o.send});
  emu::exclusive([&] {
    for (size_t i = 0; i < ops.size(); i++)
      if (ops[i].send) staged[i].assign(ops[i].buf, ops[i].buf + ops[i].bytes);
  }, &sent);
  std::vector<MPI_Request> reqs(ops.size());
  for (size_t i = 0; i < ops.size(); i++) {
    const P2p& o = ops[i];
    if (!o.send) staged[i].resize(o.bytes);
    const int n = static_cast<int>(o.bytes);
    check_mpi(o.send ? MPI_Isend(staged[i].data(), n, MPI_BYTE, o.peer, 0, c->mpi, &reqs[i])
                     : MPI_Irecv(staged[i].data(), n, MPI_BYTE, o.peer, 0, c->mpi, &reqs[i]),
              o.send ? "MPI_Isend" : "MPI_Irecv");
  }
  std::vector<MPI_Status> st(ops.size());
  wait_all(reqs, st.data(), "MPI_Testall");
  for (size_t i = 0; i < ops.size(); i++) {
    int got = 0;
    MPI_Get_count(&st[i], MPI_BYTE, &got);
    if (!ops[i].send && static_cast<size_t>(got) != ops[i].bytes)
      emu::die("emulated NCCL: ncclRecv of " + std::to_string(ops[i].bytes) + " bytes from rank " +
               std::to_string(ops[i].peer) + " got " + std::to_string(got));
  }
  emu::exclusive([&] {
    for (size_t i = 0; i < ops.size(); i++)
      if (!ops[i].send) std::memcpy(ops[i].buf, staged[i].data(), ops[i].bytes);
  }, &received);
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    default: return "emulated NCCL error";
  }
}
const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "cuda_emu nccl");
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (std::strcmp(id.internal, "cuda_emu nccl") != 0) return error(ncclInvalidArgument, "not an ncclGetUniqueId id");
  if (emu::injected("ncclCommInitRank")) return error(ncclSystemError, "injected failure (CUDA_EMU_FAIL)");
  auto* c = new ncclComm;
  c->rank = rank;
  c->size = nranks;
  if (nranks > 1) {
    int inited = 0, provided = 0, world = 0, me = 0;
    MPI_Initialized(&inited);
    if (!inited) return delete c, error(ncclInvalidUsage, "several ranks need MPI (the emulation's transport)");
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      return delete c, error(ncclInvalidUsage, "streams call MPI from their own threads: MPI_THREAD_MULTIPLE needed");
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (world != nranks || me != rank)
      return delete c, error(ncclInvalidArgument, "rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                                                    " is not MPI_COMM_WORLD's rank " + std::to_string(me) + " of " +
                                                    std::to_string(world));
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  }
  *out = c;
  return ncclSuccess;
}

// Waits for the calls queued on it, as NCCL's destroy does before freeing.
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return error(ncclInvalidArgument, "null communicator");
  {
    std::unique_lock<std::mutex> lock(c->mu);
    c->cv.wait(lock, [&] { return c->finished == c->issued; });
  }
  if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t c,
                           cudaStream_t stream) {
  if (!c) return error(ncclInvalidArgument, "null communicator");
  if (t_group_depth > 0) return error(ncclInvalidUsage, "the emulation groups only ncclSend/ncclRecv");
  if (emu::injected("ncclAllGather")) return error(ncclUnhandledCudaError, "injected failure (CUDA_EMU_FAIL)");
  const size_t bytes = count * type_bytes(type);
  auto* out = static_cast<char*>(recv);
  const auto* in = static_cast<const char*>(send);
  const bool in_place = in == out + c->rank * bytes;
  std::vector<emu::Range> uses = {{out, bytes * c->size, true}};
  if (!in_place) uses.push_back({in, bytes, false});
  queue_call(c, stream, "ncclAllGather", bytes, std::move(uses), [=] {
    std::vector<char> mine(bytes), all(bytes * c->size);
    const std::vector<emu::Range> read = {{in, bytes, false}}, written = {{out, all.size(), true}};
    emu::exclusive([&] { std::memcpy(mine.data(), in, bytes); }, &read);
    if (c->size > 1)
      all_gather(c, mine.data(), all.data(), bytes);
    else
      all = mine;
    emu::exclusive([&] { std::memcpy(out, all.data(), all.size()); }, &written);
  });
  return ncclSuccess;
}

// NCCL's ring: rank r's chunk is summed starting from rank r + 1, one rank a hop, the partial sum
// stored in the buffer's type between hops (bf16 rounds at every hop), ending at rank r. Not rank
// order: a test that expects MpiComm's bits from it fails here as it would on GPUs.
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t stream) {
  if (!c) return error(ncclInvalidArgument, "null communicator");
  if (t_group_depth > 0) return error(ncclInvalidUsage, "the emulation groups only ncclSend/ncclRecv");
  if (op != ncclSum || (type != ncclFloat32 && type != ncclBfloat16))
    return error(ncclInvalidArgument, "the emulation's ncclReduceScatter sums float32 or bfloat16 only");
  if (emu::injected("ncclReduceScatter")) return error(ncclUnhandledCudaError, "injected failure (CUDA_EMU_FAIL)");
  const size_t bytes = count * type_bytes(type);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  std::vector<emu::Range> uses = {{in, bytes * c->size, false}, {out, bytes, true}};
  queue_call(c, stream, "ncclReduceScatter", bytes, std::move(uses), [=] {
    std::vector<char> mine(bytes * c->size), all(bytes * c->size * c->size);
    const std::vector<emu::Range> read = {{in, mine.size(), false}}, written = {{out, bytes, true}};
    emu::exclusive([&] { std::memcpy(mine.data(), in, mine.size()); }, &read);
    if (c->size > 1)
      all_gather(c, mine.data(), all.data(), mine.size());
    else
      all = mine;
    // Element i of rank p's contribution to this rank's chunk.
    auto at = [&](int p, size_t i) -> double {
      const char* e = all.data() + (size_t(p) * c->size + c->rank) * bytes + i * type_bytes(type);
      if (type == ncclFloat32) {
        float f;
        std::memcpy(&f, e, 4);
        return f;
      }
      uint16_t h;
      std::memcpy(&h, e, 2);
      return __uint_as_float(uint32_t(h) << 16);
    };
    std::vector<char> result(bytes);
    for (size_t i = 0; i < count; i++) {
      float acc = static_cast<float>(at((c->rank + 1) % c->size, i));
      for (int hop = 2; hop <= c->size; hop++) {
        acc += static_cast<float>(at((c->rank + hop) % c->size, i));
        if (type == ncclBfloat16) acc = __uint_as_float(uint32_t(emu::round_bf16(acc)) << 16);
      }
      if (type == ncclFloat32) {
        std::memcpy(result.data() + 4 * i, &acc, 4);
      } else {
        const uint16_t h = emu::round_bf16(acc);
        std::memcpy(result.data() + 2 * i, &h, 2);
      }
    }
    emu::exclusive([&] { std::memcpy(out, result.data(), bytes); }, &written);
  });
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  t_group_depth++;
  return ncclSuccess;
}

// A point-to-point call joins the open group, or is a group of its own.
ncclResult_t p2p(const P2p& op) {
  if (!op.comm || op.peer < 0 || op.peer >= op.comm->size || op.peer == op.comm->rank)
    return error(ncclInvalidArgument, "bad peer");
  if (t_group_depth > 0) {
    t_group.push_back(op);
    return ncclSuccess;
  }
  t_group = {op};
  t_group_depth = 1;
  return ncclGroupEnd();
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c, cudaStream_t s) {
  return p2p(P2p{true, const_cast<char*>(static_cast<const char*>(buf)), count * type_bytes(type), peer, c, s});
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t c, cudaStream_t s) {
  return p2p(P2p{false, static_cast<char*>(buf), count * type_bytes(type), peer, c, s});
}

ncclResult_t ncclGroupEnd(void) {
  if (t_group_depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0 || t_group.empty()) return ncclSuccess;
  std::vector<P2p> ops = std::move(t_group);
  t_group.clear();
  if (emu::injected("ncclGroupEnd")) return error(ncclUnhandledCudaError, "injected failure (CUDA_EMU_FAIL)");
  for (const P2p& o : ops)
    if (o.comm != ops.front().comm || o.stream != ops.front().stream)
      return error(ncclInvalidUsage, "the emulation groups calls of one communicator on one stream only");
  uint64_t sent = 0;
  std::vector<emu::Range> uses;
  for (const P2p& o : ops) {
    if (o.send) sent += o.bytes;
    uses.push_back({o.buf, o.bytes, !o.send});
  }
  queue_call(ops.front().comm, ops.front().stream, "a group of ncclSend/ncclRecv", sent, std::move(uses),
             [ops] { run_group(ops); });
  return ncclSuccess;
}

}  // extern "C"

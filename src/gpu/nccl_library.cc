// NCCL's entry points that zoe calls (nccl_comm.cc, `zoe info`), defined here so that the library loads at the
// first call, not with every process that links the CUDA backend (LazyLibrary says why). The
// signatures are nccl.h's: a mismatch is a compile error. Where NCCL cannot be loaded, a call
// returns ncclSystemError and ncclGetErrorString / ncclGetLastError say which file failed and why,
// which NcclComm's status carries to the job's error line.
#include "gpu/nccl_library.h"

#include <nccl.h>

#include "gpu/lazy_library.h"

#define ZOE_STR2(x) #x
#define ZOE_STR(x) ZOE_STR2(x)

namespace zoe::gpu {
namespace {

LazyLibrary& library() {
  static LazyLibrary lib(LazyLibrary::candidates("ZOE_NCCL_LIBRARY", ZOE_NCCL_PATH, "libnccl.so." ZOE_STR(NCCL_MAJOR)));
  return lib;
}

}  // namespace

bool nccl_loaded() { return library().loaded(); }

std::string nccl_text() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) version = 0;
  return library().describe("NCCL", version);
}

}  // namespace zoe::gpu

#define ZOE_NCCL_FORWARD(name, ...) ZOE_LAZY_FORWARD(zoe::gpu::library(), ncclSystemError, name, __VA_ARGS__)

extern "C" {

ncclResult_t ncclGetVersion(int* version) { ZOE_NCCL_FORWARD(ncclGetVersion, version); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { ZOE_NCCL_FORWARD(ncclGetUniqueId, id); }

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  ZOE_NCCL_FORWARD(ncclCommInitRank, comm, nranks, id, rank);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { ZOE_NCCL_FORWARD(ncclCommDestroy, comm); }

const char* ncclGetErrorString(ncclResult_t result) {
  static auto* const real = zoe::gpu::library().function<decltype(ncclGetErrorString)>("ncclGetErrorString");
  return real ? real(result) : zoe::gpu::library().error_text();
}

const char* ncclGetLastError(ncclComm_t comm) {
  static auto* const real = zoe::gpu::library().function<decltype(ncclGetLastError)>("ncclGetLastError");
  return real ? real(comm) : zoe::gpu::library().error_text();
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  ZOE_NCCL_FORWARD(ncclAllGather, send, recv, count, type, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  ZOE_NCCL_FORWARD(ncclReduceScatter, send, recv, count, type, op, comm, stream);
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  ZOE_NCCL_FORWARD(ncclSend, send, count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  ZOE_NCCL_FORWARD(ncclRecv, recv, count, type, peer, comm, stream);
}

ncclResult_t ncclGroupStart() { ZOE_NCCL_FORWARD(ncclGroupStart); }

ncclResult_t ncclGroupEnd() { ZOE_NCCL_FORWARD(ncclGroupEnd); }

}  // extern "C"

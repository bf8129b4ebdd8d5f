// Collectives between ranks, with byte counters. MpiComm runs over OpenMPI between processes;
// SelfComm is the one-rank case; NcclComm (src/gpu) runs over NCCL between GPUs.
//
// Two kinds of traffic:
//   - tensor traffic (all_gather, reduce_scatter) moves device memory of the paired device
//     (set_device) and is ordered on its streams: it starts after the work enqueued before it on
//     the compute stream, and work enqueued after it on the compute stream sees its result;
//   - control traffic (all_reduce_sum, broadcast, barrier, gather_to_root, all_gather_control,
//     barrier_within) moves host memory and is synchronous; it always runs over MPI.
//
// Reductions are deterministic: reduce_scatter receives every rank's chunk and sums them in rank
// order 0..N-1 in fp32, so a given element's sum does not depend on message sizes, bucketing or
// the ZeRO stage. That is what makes stages 0-3 bitwise identical.
//
// Byte counters: what this rank puts on the wire under the bandwidth-optimal algorithm, the
// nccl-tests convention: all_gather and reduce_scatter send (N-1) chunks, all_reduce of a small
// vector sends (N-1) copies of it (gather-based), broadcast counts the payload at the root.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zoe/device.h"
#include "zoe/dtype.h"
#include "zoe/ledger.h"
#include "zoe/status.h"

namespace zoe {

class Device;

struct CommBytes {
  uint64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0, broadcast = 0;
  uint64_t total() const { return all_gather + reduce_scatter + all_reduce + broadcast; }
  CommBytes& operator+=(const CommBytes& o) {
    all_gather += o.all_gather;
    reduce_scatter += o.reduce_scatter;
    all_reduce += o.all_reduce;
    broadcast += o.broadcast;
    return *this;
  }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv holds size() chunks of `chunk_bytes`; this rank's chunk is `send`. send may alias its
  // own slot in recv (in place).
  virtual Status all_gather(const void* send, void* recv, size_t chunk_bytes) = 0;
  // send holds size() chunks of `chunk_count` elements; recv gets this rank's chunk of the sum.
  // recv may alias its own chunk inside send.
  virtual Status reduce_scatter(const void* send, void* recv, size_t chunk_count, DType dtype) = 0;
  // Element-wise sum over ranks of a small float64 vector, in rank order (identical everywhere).
  virtual Status all_reduce_sum(double* v, size_t n) = 0;
  virtual Status broadcast(void* buf, size_t bytes, int root) = 0;
  virtual Status barrier() = 0;
  // Gathers `bytes` from every rank to rank 0 (recv ignored elsewhere); not counted as traffic
  // of the training step (reports and traces only).
  virtual Status gather_to_root(const void* send, void* recv, size_t bytes) = 0;
  // Control traffic (the engine's agreement on which collective comes next): an all-gather of
  // `bytes` per rank that is not counted as traffic of the training step.
  virtual Status all_gather_control(const void* send, void* recv, size_t bytes) = 0;
  // A barrier that gives up after `seconds`: true when every rank reached it in time. A rank
  // that fails uses it to learn whether the others failed too (then all exit together) or are
  // stuck in a collective (then it aborts the job instead of waiting forever).
  virtual bool barrier_within(double seconds) = 0;

  // The device whose memory tensor traffic moves, and whose sum_chunks kernel reduces. Set once,
  // before the first tensor collective; nullptr before that device goes away.
  virtual void set_device(Device* d) { device_ = d; }

  // Staging buffers the communicator holds are booked here (host tier, kind comm); what is held
  // already moves to the new ledger. nullptr unbooks (before that ledger goes away).
  virtual void set_ledger(Ledger* l) { ledger_ = l; }

  // Holds from now on the staging a reduce_scatter of up to `chunk_count` elements of `dtype` a
  // chunk needs beside its arguments (0: gives it back). An engine asks before it sizes its
  // device reserve, so the buffer is booked then and never taken from the reserve in the middle
  // of a step; a larger reduce_scatter still grows it. Default: nothing is staged.
  virtual Status reserve_staging(size_t chunk_count, DType dtype) { return Status::Ok(); }

  // A communicator of its own over the same ranks, paired with the same device and booking its
  // staging in the same ledger (until the engine that asked for it goes), for collectives
  // that another thread runs beside this one's (MPI_Comm_dup; the library must allow
  // MPI_THREAD_MULTIPLE). Collective: every rank calls it at the same point. Unsupported where
  // the transport cannot.
  virtual Result<std::unique_ptr<Comm>> duplicate() {
    return Status::Unsupported("this communicator cannot be duplicated");
  }

  // The stream of the paired device that orders this communicator's tensor traffic.
  // Stream::kCompute (the default): as said at the top, each collective after the compute work
  // enqueued before it and before the compute work enqueued after it. Another stream (NcclComm's
  // duplicate: Stream::kCommThread) is ordered by events only, so that compute goes on while it
  // runs: the caller makes it wait for what the inputs need (Device::wait_on(tensor_stream(), e))
  // and makes the results' readers wait for an event recorded on it after the collective. The
  // collectives of such a communicator must not run beside the original's (NCCL promises no
  // progress to two communicators' kernels in flight on one GPU): its owner issues them all.
  virtual Stream tensor_stream() const { return Stream::kCompute; }

  const CommBytes& bytes_sent() const { return bytes_; }
  void reset_counters() { bytes_ = {}; }
  // Traffic a duplicate sent on this communicator's behalf.
  void add_bytes(const CommBytes& b) { bytes_ += b; }

 protected:
  CommBytes bytes_;
  Ledger* ledger_ = nullptr;
  Device* device_ = nullptr;
};

// One rank's outcome made everyone's (collective): every rank returns an error when any rank
// had one, its own if it had one, else `elsewhere` followed by "; rank R: " and the first failed
// rank's message, with that error's code. So no rank goes on alone into a collective that the
// failed rank will never join, and every rank's line says what failed.
Status agree(Comm& comm, const Status& mine, const Status& elsewhere);

// Sums chunk r of `n` chunks (each `count` elements of `dtype`, stored back to back in `chunks`)
// into out, in chunk order, accumulating in fp32: the CPU device's sum_chunks kernel.
void sum_chunks_in_order(const void* chunks, int n, size_t count, DType dtype, void* out);

std::unique_ptr<Comm> make_self_comm();
// MPI counts are int: tensor collectives move at most this many bytes per rank and call.
constexpr size_t kMaxMpiPiece = size_t{1} << 30;
// Initialises MPI if needed. Fails with a clear Status when MPI cannot start. Chunks larger
// than max_piece_bytes are moved in pieces (tests make it small to reach that path).
Result<std::unique_ptr<Comm>> make_mpi_comm(size_t max_piece_bytes = kMaxMpiPiece);
// True when this process was launched by mpirun (OMPI/PMI environment present).
bool launched_by_mpirun();
// True when MPI is initialised and lets any thread call it, one call at a time.
bool mpi_serialized_calls();
// Finalizes MPI if it was initialised here; call once before exit.
void finalize_mpi();

}  // namespace zoe

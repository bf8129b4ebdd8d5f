// NcclComm: tensor traffic between GPUs over NCCL, control traffic over the MPI communicator it
// was bootstrapped through (see comm/comm.h for the split).
//
// - all_gather is ncclAllGather (in place when send is this rank's slot of recv);
// - reduce_scatter (Sum::kRankOrder, the default) is NOT ncclReduceScatter, whose summation order
//   depends on NCCL's algorithm and the message size: every rank sends chunk k of its buffer to
//   rank k (ncclSend/ncclRecv in one group) into a staging buffer, then the device's sum_chunks
//   adds the received chunks in rank order 0..N-1 in fp32, as MpiComm does. Results are bitwise
//   those of MpiComm on the CPU device, and identical across ZeRO stages and bucket sizes.
//   Sum::kNccl (zoe.nccl_reduce_scatter) is ncclReduceScatter itself: no staging buffer, NCCL's
//   ring, its order and its rounding (bf16 partial sums at each hop);
// - both run on the device's comm stream, after the work enqueued on the compute stream before
//   them, and the compute stream waits for them (Device::wait_on): they return once enqueued;
// - duplicate() makes a second NCCL communicator over the same ranks (bootstrapped through a
//   duplicate of the MPI communicator, which then carries its control traffic) whose collectives
//   run on Stream::kCommThread ordered by events only (Comm::tensor_stream): the engine's
//   communication thread reduces unit k while unit k-1's backward computes. NCCL does not promise
//   progress to two communicators' kernels in flight on one GPU, so while a duplicate lives its
//   owner issues every tensor collective (the engine's CommWorker does);
// - the staging buffer is device memory of the paired device (Kind::kComm, booked in its
//   ledger), grown to the largest reduce_scatter and reused; set_device(nullptr) returns it, so
//   call that before the device goes away (as comm.h asks);
// - byte counters are MpiComm's: all_gather and reduce_scatter (N-1) chunks, all_reduce_sum
//   (N-1) copies of the vector, broadcast the payload at the root.
//
// The MPI communicator passed in carries the control traffic and must outlive the NcclComm.
#pragma once
#include <nccl.h>

#include <memory>

#include "comm/comm.h"
#include "zoe/device.h"
#include "zoe/status.h"

namespace zoe {

class CudaDevice;

class NcclComm final : public Comm {
 public:
  // How reduce_scatter sums (see above).
  enum class Sum { kRankOrder, kNccl };

  // Use make_nccl_comm. Takes ownership of `comm` (and of `owned_control`, when given: then
  // `control` is it). `stream`: kComm, ordered with compute; kCommThread, ordered by events.
  NcclComm(Comm& control, CudaDevice& dev, ncclComm_t comm, Stream stream = Stream::kComm,
           std::unique_ptr<Comm> owned_control = nullptr, Sum sum = Sum::kRankOrder);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status all_gather(const void* send, void* recv, size_t chunk_bytes) override;
  Status reduce_scatter(const void* send, void* recv, size_t chunk_count, DType dtype) override;

  Status all_reduce_sum(double* v, size_t n) override;
  Status broadcast(void* buf, size_t bytes, int root) override;
  Status barrier() override;
  Status gather_to_root(const void* send, void* recv, size_t bytes) override;
  Status all_gather_control(const void* send, void* recv, size_t bytes) override;
  bool barrier_within(double seconds) override;
  // Collective. The original only: one communication thread, one stream of its own.
  Result<std::unique_ptr<Comm>> duplicate() override;
  Stream tensor_stream() const override { return by_events() ? stream_ : Stream::kCompute; }

  // Only the CudaDevice this communicator was made with (or nullptr) carries tensor traffic;
  // changing it returns the staging buffer to the device it came from.
  void set_device(Device* d) override;

  // The rank-order sum's staging (size() chunks); NCCL's own sum stages nothing of ours.
  Status reserve_staging(size_t chunk_count, DType dtype) override;

  size_t staging_bytes() const { return staging_.bytes; }

 private:
  bool by_events() const { return stream_ != Stream::kComm; }
  Status begin(const char* what);  // the device check, then (ordered with compute) comm waits for compute
  Status end();                    // (ordered with compute) compute waits for comm
  Status grow_staging(size_t bytes);
  void release_staging();
  Status check(ncclResult_t r, const char* what) const;

  std::unique_ptr<Comm> owned_control_;  // a duplicate's MPI communicator
  Comm& control_;
  CudaDevice& cuda_;
  ncclComm_t comm_;
  Stream stream_;
  Sum sum_;
  int rank_ = 0, size_ = 1;
  Buffer staging_;
};

// Bootstraps NCCL through `control` (an MPI communicator: rank 0 makes the ncclUniqueId and
// broadcasts it; every rank then joins on dev's GPU). When ncclGetUniqueId or ncclCommInitRank
// returns an error on any rank, every rank returns Status::CommError (a rank that dies instead
// leaves the others inside ncclCommInitRank: the job's abort path ends them). The result's
// device is `dev` (set_device(&dev) done); its duplicates sum as it does.
Result<std::unique_ptr<Comm>> make_nccl_comm(Comm& control, CudaDevice& dev,
                                             NcclComm::Sum sum = NcclComm::Sum::kRankOrder);

}  // namespace zoe

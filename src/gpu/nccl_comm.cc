#include "gpu/nccl_comm.h"

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "gpu/cuda_device.h"

namespace zoe {

namespace {

// Joins every rank to a new NCCL communicator on dev's GPU, bootstrapped through `control` (see
// make_nccl_comm).
Result<ncclComm_t> init_nccl(Comm& control, CudaDevice& dev) {
  ZOE_RETURN_IF_ERROR(dev.make_current());
  // Rank 0's ncclGetUniqueId result travels with the id, so no rank waits for an id that never
  // comes.
  struct Hello {
    int32_t rc;
    ncclUniqueId id;
  } hello;
  std::memset(&hello, 0, sizeof hello);
  if (control.rank() == 0) hello.rc = static_cast<int32_t>(ncclGetUniqueId(&hello.id));
  ZOE_RETURN_IF_ERROR(control.broadcast(&hello, sizeof hello, 0));
  if (hello.rc != ncclSuccess)
    return Status::CommError(fmt::format("NCCL ncclGetUniqueId failed on rank 0: {}",
                                         ncclGetErrorString(static_cast<ncclResult_t>(hello.rc))));
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, control.size(), hello.id, control.rank());
  // A rank whose init failed returns at once, without agreeing: the others may still wait for it
  // inside NCCL's collective init, where no control message reaches them. The job then ends as a
  // rank failing alone does (the CLI's fail(): a line naming the rank, then MPI_Abort).
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    return Status::CommError(fmt::format("NCCL ncclCommInitRank failed on rank {} (GPU {}): {}{}{}", control.rank(),
                                         dev.gpu(), ncclGetErrorString(r), last && *last ? ": " : "",
                                         last ? last : ""));
  }
  const Status all = agree(control, Status::Ok(), Status::CommError("NCCL ncclCommInitRank failed on another rank"));
  if (!all.ok()) {
    ncclCommDestroy(comm);
    return all;
  }
  return comm;
}

}  // namespace

NcclComm::NcclComm(Comm& control, CudaDevice& dev, ncclComm_t comm, Stream stream, std::unique_ptr<Comm> owned_control,
                   Sum sum)
    : owned_control_(std::move(owned_control)),
      control_(control),
      cuda_(dev),
      comm_(comm),
      stream_(stream),
      sum_(sum),
      rank_(control.rank()),
      size_(control.size()) {
  device_ = &cuda_;
}

NcclComm::~NcclComm() {
  release_staging();
  if (!comm_) return;
  Status s = cuda_.make_current();
  if (s.ok()) s = check(ncclCommDestroy(comm_), "ncclCommDestroy");
  if (!s.ok()) std::fprintf(stderr, "zoe: %s\n", s.message().c_str());
}

Status NcclComm::check(ncclResult_t r, const char* what) const {
  if (r == ncclSuccess) return Status::Ok();
  const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
  return Status::CommError(fmt::format("NCCL {} failed on rank {}: {}{}{}", what, rank_, ncclGetErrorString(r),
                                       last && *last ? ": " : "", last ? last : ""));
}

void NcclComm::set_device(Device* d) {
  if (d != device_) release_staging();
  device_ = d;
}

Status NcclComm::begin(const char* what) {
  if (device_ != &cuda_)
    return Status::Invalid(fmt::format(
        "NcclComm::{}: tensor traffic needs the cuda device the communicator was made with (set_device)", what));
  ZOE_RETURN_IF_ERROR(cuda_.make_current());
  return by_events() ? Status::Ok() : cuda_.wait_on(stream_, cuda_.record(Stream::kCompute));
}

Status NcclComm::end() { return by_events() ? Status::Ok() : cuda_.wait_on(Stream::kCompute, cuda_.record(stream_)); }

Status NcclComm::grow_staging(size_t bytes) {
  if (bytes <= staging_.bytes) return Status::Ok();
  release_staging();
  ZOE_ASSIGN_OR_RETURN(staging_, cuda_.alloc(bytes, Tier::kDevice, Kind::kComm));
  return Status::Ok();
}

Status NcclComm::reserve_staging(size_t chunk_count, DType dtype) {
  if (chunk_count == 0 || sum_ == Sum::kNccl) {
    release_staging();
    return Status::Ok();
  }
  if (device_ != &cuda_) return Status::Ok();  // staging is the paired device's memory
  return grow_staging(chunk_count * dtype_size(dtype) * size_);
}

void NcclComm::release_staging() {
  if (!staging_) return;
  // The device may still run the last reduce_scatter's transfers and sum from it.
  Status s = cuda_.synchronize();
  if (!s.ok()) std::fprintf(stderr, "zoe: releasing the NCCL staging buffer: %s\n", s.message().c_str());
  cuda_.free(staging_);
}

Status NcclComm::all_gather(const void* send, void* recv, size_t chunk_bytes) {
  ZOE_RETURN_IF_ERROR(begin("all_gather"));
  if (chunk_bytes > 0) {
    // In place when send is this rank's slot of recv: NCCL recognises it by the address.
    ZOE_RETURN_IF_ERROR(check(ncclAllGather(send, recv, chunk_bytes, ncclUint8, comm_, cuda_.stream(stream_)),
                              "ncclAllGather"));
  }
  ZOE_RETURN_IF_ERROR(end());
  bytes_.all_gather += static_cast<uint64_t>(size_ - 1) * chunk_bytes;
  return Status::Ok();
}

Status NcclComm::reduce_scatter(const void* send, void* recv, size_t count, DType dtype) {
  ZOE_RETURN_IF_ERROR(begin("reduce_scatter"));
  const size_t chunk_bytes = count * dtype_size(dtype);
  if (count > 0 && sum_ == Sum::kNccl) {
    const ncclDataType_t type = dtype == DType::kF32 ? ncclFloat32 : dtype == DType::kBF16 ? ncclBfloat16 : ncclFloat16;
    ZOE_RETURN_IF_ERROR(check(ncclReduceScatter(send, recv, count, type, ncclSum, comm_, cuda_.stream(stream_)),
                              "ncclReduceScatter"));
  } else if (count > 0) {
    ZOE_RETURN_IF_ERROR(grow_staging(chunk_bytes * size_));
    const char* s = static_cast<const char*>(send);
    char* staging = staging_.as<char>();
    cudaStream_t stream = cuda_.stream(stream_);
    // Our own chunk is a copy; every other rank's chunk of our slot arrives by ncclRecv.
    ZOE_RETURN_IF_ERROR(cuda_.copy(staging + rank_ * chunk_bytes, s + rank_ * chunk_bytes, chunk_bytes, stream_));
    if (size_ > 1) {
      ZOE_RETURN_IF_ERROR(check(ncclGroupStart(), "ncclGroupStart"));
      Status first;  // the group is closed whatever happens inside it
      for (int p = 0; p < size_ && first.ok(); ++p) {
        if (p == rank_) continue;
        first = check(ncclSend(s + p * chunk_bytes, chunk_bytes, ncclUint8, p, comm_, stream), "ncclSend");
        if (first.ok())
          first = check(ncclRecv(staging + p * chunk_bytes, chunk_bytes, ncclUint8, p, comm_, stream), "ncclRecv");
      }
      const Status closed = check(ncclGroupEnd(), "ncclGroupEnd");
      ZOE_RETURN_IF_ERROR(first);
      ZOE_RETURN_IF_ERROR(closed);
    }
    // On the communicator's stream: the next reduce_scatter's transfers into staging come after.
    ZOE_RETURN_IF_ERROR(cuda_.sum_chunks_on(stream_, recv, staging_.data, size_, count, dtype));
  }
  ZOE_RETURN_IF_ERROR(end());
  bytes_.reduce_scatter += static_cast<uint64_t>(size_ - 1) * chunk_bytes;
  return Status::Ok();
}

Status NcclComm::all_reduce_sum(double* v, size_t n) {
  ZOE_RETURN_IF_ERROR(control_.all_reduce_sum(v, n));
  bytes_.all_reduce += static_cast<uint64_t>(size_ - 1) * n * sizeof(double);
  return Status::Ok();
}

Status NcclComm::broadcast(void* buf, size_t bytes, int root) {
  ZOE_RETURN_IF_ERROR(control_.broadcast(buf, bytes, root));
  if (rank_ == root) bytes_.broadcast += bytes;
  return Status::Ok();
}

Status NcclComm::barrier() { return control_.barrier(); }

Status NcclComm::gather_to_root(const void* send, void* recv, size_t bytes) {
  return control_.gather_to_root(send, recv, bytes);
}

Status NcclComm::all_gather_control(const void* send, void* recv, size_t bytes) {
  return control_.all_gather_control(send, recv, bytes);
}

bool NcclComm::barrier_within(double seconds) { return control_.barrier_within(seconds); }

Result<std::unique_ptr<Comm>> NcclComm::duplicate() {
  if (by_events()) return Status::Unsupported("NcclComm: a duplicate cannot be duplicated (one communication thread)");
  if (device_ != &cuda_)
    return Status::Invalid("NcclComm::duplicate: needs the cuda device the communicator was made with (set_device)");
  ZOE_ASSIGN_OR_RETURN(std::unique_ptr<Comm> control, control_.duplicate());
  ZOE_ASSIGN_OR_RETURN(ncclComm_t comm, init_nccl(*control, cuda_));
  Comm& c = *control;
  auto d = std::make_unique<NcclComm>(c, cuda_, comm, Stream::kCommThread, std::move(control), sum_);
  d->set_ledger(ledger_);
  return Result<std::unique_ptr<Comm>>(std::unique_ptr<Comm>(std::move(d)));
}

Result<std::unique_ptr<Comm>> make_nccl_comm(Comm& control, CudaDevice& dev, NcclComm::Sum sum) {
  ZOE_ASSIGN_OR_RETURN(ncclComm_t comm, init_nccl(control, dev));
  return Result<std::unique_ptr<Comm>>(
      std::unique_ptr<Comm>(new NcclComm(control, dev, comm, Stream::kComm, nullptr, sum)));
}

}  // namespace zoe

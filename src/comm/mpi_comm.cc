// MpiComm: collectives over OpenMPI. The reduction arithmetic is ours (see comm.h) so it is
// deterministic and works for bf16/fp16; MPI moves the bytes. The staging buffer grows once and
// is reused: per-call large allocations cost seconds per GiB on fresh pages here.
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/comm.h"
#include "zoe/device.h"

namespace zoe {
namespace {

bool g_we_initialised = false;

// How a rank waits for a collective (ZOE_MPI_WAIT). OpenMPI's blocking calls spin in its progress
// loop: a rank waiting for a slower peer keeps busy a core that the peer's compute, its own
// communication thread or another rank on the node needs (2 ranks on 2 cores spent 70-90 % of
// zero_mpi_test there). kPoll starts the collective nonblocking and tests it, busily for 200 us (a
// collective whose peers are there completes within that), then with sleeps of 20 us growing to
// 200 us between tests; kSpin is MPI's own wait.
enum class MpiWait { kPoll, kSpin };

Status check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status::CommError(fmt::format("MPI {} failed: {}", what, std::string(msg, len)));
}

// `piece` bytes whose extent is a whole chunk: count 1 per rank addresses that rank's piece
// inside its chunk, so pieces of large chunks move in place with no staging copy.
class PieceType {
 public:
  PieceType(int piece, size_t chunk_bytes) {
    MPI_Type_contiguous(piece, MPI_BYTE, &bytes_);
    MPI_Type_create_resized(bytes_, 0, static_cast<MPI_Aint>(chunk_bytes), &slot_);
    MPI_Type_commit(&slot_);
  }
  ~PieceType() {
    MPI_Type_free(&slot_);
    MPI_Type_free(&bytes_);
  }
  PieceType(const PieceType&) = delete;
  PieceType& operator=(const PieceType&) = delete;
  MPI_Datatype get() const { return slot_; }

 private:
  MPI_Datatype bytes_, slot_;
};

class MpiComm final : public Comm {
 public:
  // `owned`: a duplicate this object frees.
  MpiComm(size_t max_piece, MPI_Comm comm, bool owned, MpiWait wait)
      : max_piece_(max_piece), comm_(comm), owned_(owned), wait_(wait) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as return codes (and so as Status), instead of aborting the job from
    // inside MPI before zoe can say what failed.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  // Two threads may then run collectives at once, each on its own communicator.
  Result<std::unique_ptr<Comm>> duplicate() override {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      return Status::Unsupported("MPI was started without MPI_THREAD_MULTIPLE: collectives stay on one thread");
    MPI_Comm dup;
    ZOE_RETURN_IF_ERROR(check(MPI_Comm_dup(comm_, &dup), "Comm_dup"));
    auto d = std::make_unique<MpiComm>(max_piece_, dup, true, wait_);
    d->set_device(device_);
    d->set_ledger(ledger_);  // its staging is communication memory of the same rank
    return std::unique_ptr<Comm>(std::move(d));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status all_gather(const void* send, void* recv, size_t chunk_bytes) override {
    auto access = host_access();
    char* r = static_cast<char*>(recv);
    const char* mine = r + rank_ * chunk_bytes;
    // MPI counts are int: at most 1 GiB per rank and call. A piece's receive type has the
    // extent of a whole chunk, so every rank's piece lands in its slot directly: no staging and
    // no copies, whatever the size (one plain call below 1 GiB).
    for (size_t off = 0; off < chunk_bytes; off += max_piece_) {
      int piece = static_cast<int>(std::min(max_piece_, chunk_bytes - off));
      const void* sbuf = send == mine ? MPI_IN_PLACE : static_cast<const char*>(send) + off;
      if (static_cast<size_t>(piece) == chunk_bytes) {
        ZOE_RETURN_IF_ERROR(
            done(MPI_Iallgather(sbuf, piece, MPI_BYTE, r, piece, MPI_BYTE, comm_, &req_), "Allgather"));
        continue;
      }
      PieceType slot(piece, chunk_bytes);
      ZOE_RETURN_IF_ERROR(
          done(MPI_Iallgather(sbuf, piece, MPI_BYTE, r + off, 1, slot.get(), comm_, &req_), "Allgather"));
    }
    bytes_.all_gather += (size_ - 1) * chunk_bytes;
    return Status::Ok();
  }

  Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    size_t esz = dtype_size(dtype), chunk_bytes = count * esz;
    const char* s = static_cast<const char*>(send);
    auto access = host_access();
    // Every rank sends its chunk k to rank k; we receive our chunk from all ranks into staging,
    // then sum in rank order. Chunks beyond MPI's int counts go in pieces; a piece's send type
    // has the extent of a whole chunk, so pieces are sent from where they are.
    const size_t piece_elems = reduce_piece_elems(esz);
    for (size_t e0 = 0; e0 < count; e0 += piece_elems) {
      size_t pe = std::min(piece_elems, count - e0);
      int pb = static_cast<int>(pe * esz);
      ZOE_RETURN_IF_ERROR(grow(pe * esz * size_));
      if (pe == count) {
        ZOE_RETURN_IF_ERROR(done(MPI_Ialltoall(s, pb, MPI_BYTE, staging_, pb, MPI_BYTE, comm_, &req_), "Alltoall"));
      } else {
        PieceType slot(pb, chunk_bytes);
        ZOE_RETURN_IF_ERROR(
            done(MPI_Ialltoall(s + e0 * esz, 1, slot.get(), staging_, pb, MPI_BYTE, comm_, &req_), "Alltoall"));
      }
      char* out = static_cast<char*>(recv) + e0 * esz;
      if (device_)
        ZOE_RETURN_IF_ERROR(device_->sum_chunks(out, staging_, size_, pe, dtype));
      else
        sum_chunks_in_order(staging_, size_, pe, dtype, out);
    }
    bytes_.reduce_scatter += (size_ - 1) * chunk_bytes;
    return Status::Ok();
  }

  Status all_reduce_sum(double* v, size_t n) override {
    std::vector<double> all(n * size_);
    ZOE_RETURN_IF_ERROR(done(MPI_Iallgather(v, static_cast<int>(n), MPI_DOUBLE, all.data(), static_cast<int>(n),
                                            MPI_DOUBLE, comm_, &req_), "Allgather"));
    for (size_t i = 0; i < n; ++i) {
      double s = all[i];
      for (int k = 1; k < size_; ++k) s += all[k * n + i];
      v[i] = s;
    }
    bytes_.all_reduce += (size_ - 1) * n * sizeof(double);
    return Status::Ok();
  }

  Status broadcast(void* buf, size_t bytes, int root) override {
    char* b = static_cast<char*>(buf);
    for (size_t off = 0; off < bytes; off += max_piece_)
      ZOE_RETURN_IF_ERROR(done(MPI_Ibcast(b + off, static_cast<int>(std::min(max_piece_, bytes - off)), MPI_BYTE,
                                          root, comm_, &req_), "Bcast"));
    if (rank_ == root) bytes_.broadcast += bytes;
    return Status::Ok();
  }

  Status barrier() override { return done(MPI_Ibarrier(comm_, &req_), "Barrier"); }

  Status gather_to_root(const void* send, void* recv, size_t bytes) override {
    return done(MPI_Igather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, 0,
                            comm_, &req_), "Gather");
  }

  Status all_gather_control(const void* send, void* recv, size_t bytes) override {
    return done(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                               comm_, &req_), "Allgather (control)");
  }

  bool barrier_within(double seconds) override {
    MPI_Request req;
    if (MPI_Ibarrier(comm_, &req) != MPI_SUCCESS) return false;
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      int done = 0;
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      if (done) return true;
      if (std::chrono::steady_clock::now() > end) return false;  // the request is abandoned: we abort next
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  ~MpiComm() override {
    release_staging();
    int fin = 0;
    MPI_Finalized(&fin);
    if (owned_ && !fin) MPI_Comm_free(&comm_);
  }

  // One rank reserves nothing: its engine mostly reduces without a reduce_scatter (a unit's
  // first reduction of a step goes straight into its chunk), and staging there is host memory
  // that no device reserve counts on; what one rank does reduce grows it then.
  Status reserve_staging(size_t count, DType dtype) override {
    const size_t esz = dtype_size(dtype);
    if (count == 0) {
      release_staging();
      return Status::Ok();
    }
    if (size_ == 1) return Status::Ok();
    return grow(std::min(count, reduce_piece_elems(esz)) * esz * size_);
  }

  // The staging buffer is host memory the device's sum_chunks kernel reads.
  void set_device(Device* d) override {
    if (device_ && staging_) device_->unregister_host(staging_);
    device_ = d;
    if (device_ && staging_) (void)device_->register_host(staging_, staging_bytes_);
  }

  void set_ledger(Ledger* l) override {
    if (booked_) booked_->sub(Tier::kHost, Kind::kComm, staging_bytes_);
    ledger_ = booked_ = l;
    if (booked_ && staging_bytes_) booked_->add(Tier::kHost, Kind::kComm, staging_bytes_);
  }

 private:
  // Completes the nonblocking call `rc` that started req_, waiting as wait_ says.
  Status done(int rc, const char* what) {
    ZOE_RETURN_IF_ERROR(check(rc, what));
    if (wait_ == MpiWait::kSpin) return check(MPI_Wait(&req_, MPI_STATUS_IGNORE), what);
    using Clock = std::chrono::steady_clock;
    const Clock::time_point busy_until = Clock::now() + std::chrono::microseconds(200);
    std::chrono::microseconds nap(20);
    for (;;) {
      int flag = 0;
      ZOE_RETURN_IF_ERROR(check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), what));
      if (flag) return Status::Ok();
      if (Clock::now() < busy_until) continue;
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }

  // A reduce_scatter's elements a chunk per piece: every rank's piece fits MPI's int counts.
  size_t reduce_piece_elems(size_t esz) const { return std::max<size_t>(1, max_piece_ / esz / size_); }

  // The staging buffer is communication memory: booked in the ledger (host tier, kind comm) for
  // as long as it is held, so the ledger's peaks cover it.
  Status grow(size_t bytes) {
    if (bytes <= staging_bytes_) return Status::Ok();
    release_staging();
    size_t rounded = (bytes + 63) / 64 * 64;
    staging_ = static_cast<char*>(std::aligned_alloc(64, rounded));
    if (!staging_) return Status::OutOfMemory(fmt::format("communication staging buffer of {} bytes", bytes));
    staging_bytes_ = rounded;
    if (device_) ZOE_RETURN_IF_ERROR(device_->register_host(staging_, staging_bytes_));
    booked_ = ledger_;
    if (booked_) booked_->add(Tier::kHost, Kind::kComm, staging_bytes_);
    return Status::Ok();
  }
  void release_staging() {
    if (device_ && staging_) device_->unregister_host(staging_);
    if (booked_) booked_->sub(Tier::kHost, Kind::kComm, staging_bytes_);
    std::free(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    booked_ = nullptr;
  }

  // MPI reads and writes the paired CPU device's memory itself: the strict device lets it.
  std::unique_ptr<Device::HostAccess> host_access() {
    return device_ ? std::make_unique<Device::HostAccess>(*device_) : nullptr;
  }

  int rank_ = 0, size_ = 1;
  size_t max_piece_;  // bytes per rank and call (MPI counts are int)
  MPI_Comm comm_;
  bool owned_;  // a duplicate this object frees
  char* staging_ = nullptr;
  MpiWait wait_;
  MPI_Request req_ = MPI_REQUEST_NULL;  // the collective in flight (one at a time: see done())
  size_t staging_bytes_ = 0;
  Ledger* booked_ = nullptr;  // the ledger staging_ is booked in (it may change between grows)
};

}  // namespace

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

Result<std::unique_ptr<Comm>> make_mpi_comm(size_t max_piece_bytes) {
  if (max_piece_bytes == 0 || max_piece_bytes > kMaxMpiPiece)
    return Status::Invalid(fmt::format("MPI piece of {} bytes: must be 1..{}", max_piece_bytes, kMaxMpiPiece));
  MpiWait wait = MpiWait::kPoll;
  if (const char* e = std::getenv("ZOE_MPI_WAIT"); e && std::string(e) == "spin") wait = MpiWait::kSpin;
  else if (e && std::string(e) != "poll")
    return Status::Invalid(fmt::format("ZOE_MPI_WAIT={}: must be poll (the default) or spin", e));
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    // MULTIPLE where the library has it: the engine's communication thread runs gradient
    // reductions on a communicator of its own beside the caller's collectives; and an embedding
    // framework may call zoe (one call at a time) from its own threads, such as autograd's.
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return Status::CommError("MPI_Init_thread failed: cannot start MPI");
    g_we_initialised = true;
  }
  return std::unique_ptr<Comm>(new MpiComm(max_piece_bytes, MPI_COMM_WORLD, false, wait));
}

bool mpi_serialized_calls() {
  int inited = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  if (inited) MPI_Query_thread(&provided);
  return provided >= MPI_THREAD_SERIALIZED;
}

void finalize_mpi() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (g_we_initialised && !fin) MPI_Finalize();
  g_we_initialised = false;
}

}  // namespace zoe

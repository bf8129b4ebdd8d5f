#include "sched/stage3/chunk_load.h"

#include <algorithm>

#include "common/profiler.h"

namespace zoe {

ChunkLoad::ChunkLoad(Device& dev, PinnedPool* pool, const StateArray& a, int64_t e, int64_t n, const Buffer& dst,
                     size_t dst_off, int64_t window_elems, WindowRetirement* retirement)
    : dev_(dev), pool_(pool), retirement_(retirement), a_(a), dst_(dst) {
  // Cut [e, e + n) at part boundaries; NVMe parts further into windows.
  while (n > 0) {
    int64_t k = std::min(n, a.part_end(e) - e);
    if (!a.on_nvme(e)) {
      memory_.push_back({e, k, dst_off});
    } else {
      k = std::min<int64_t>(k, std::max<int64_t>(window_elems, 1));
      nvme_.push_back({e, k, dst_off, {}, {}});
    }
    e += k, dst_off += k * a.esize(), n -= k;
  }
}

ChunkLoad::~ChunkLoad() { (void)drain(); }

// Whatever was issued and not finished has to land (its copy queued) before its window and its
// destination go; then the copies are waited for (their Status).
Status ChunkLoad::drain() {
  if (finished_) return Status::Ok();
  for (NvmePiece& p : nvme_)
    if (p.read.valid()) (void)a_.wait(p.read);
  Status st = settle_copies();
  finished_ = true;
  return st;
}

// With a destination, the I/O thread queues the piece's copy the moment it lands.
Status ChunkLoad::read_piece(NvmePiece& p, bool wait_for_window) {
  size_t bytes = p.n * a_.esize();
  if (wait_for_window) {
    ZOE_ASSIGN_OR_RETURN(p.window, pool_->acquire(bytes));
  } else {
    ZOE_ASSIGN_OR_RETURN(p.window, pool_->try_acquire(bytes));
    if (!p.window.data()) return Status::Ok();  // no window now: finish() reads it
  }
  std::function<void()> on_landed;
  if (dst_) on_landed = [this, &p] { landed(p); };
  p.read = a_.read_async(p.e, p.n, p.window.data(), false, nullptr, std::move(on_landed));
  return Status::Ok();
}

// The copies go after the compute stream's earlier work: the destination's last user. Ordered
// here, on the caller's thread, before any copy can be queued (the I/O thread never orders).
Status ChunkLoad::order_after_compute() {
  if (h2d_ordered_) return Status::Ok();
  ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kH2D, dev_.record(Stream::kCompute)));
  h2d_ordered_ = true;
  return Status::Ok();
}

Status ChunkLoad::start() {
  started_ = true;
  if (dst_) ZOE_RETURN_IF_ERROR(order_after_compute());
  for (const MemoryPiece& p : memory_) {
    ZOE_RETURN_IF_ERROR(dev_.copy_async(dst_, p.dst_off, a_.buffer_of(p.e), a_.buffer_offset(p.e), p.n * a_.esize(),
                                        Stream::kH2D));
    std::lock_guard l(mu_);
    copied_ = dev_.record(Stream::kH2D);
    copy_issued_ = true;
  }
  for (NvmePiece& p : nvme_) {
    ZOE_RETURN_IF_ERROR(read_piece(p, false));
    if (!p.read.valid()) break;  // the pool is busy: keep the pieces in order
  }
  return Status::Ok();
}

bool ChunkLoad::reading() const {
  for (const NvmePiece& p : nvme_)
    if (p.read.valid()) return true;
  return false;
}

bool ChunkLoad::all_issued() const {
  if (!started_) return false;
  for (const NvmePiece& p : nvme_)
    if (!p.read.valid()) return false;
  return true;
}

int ChunkLoad::copies_issued() const {
  std::lock_guard l(mu_);
  int n = 0;
  for (const NvmePiece& p : nvme_) n += p.copied;
  return n;
}

void ChunkLoad::landed(NvmePiece& p) {
  std::lock_guard l(mu_);
  Status st = copy_piece_locked(p);
  if (!st.ok() && copy_error_.ok()) copy_error_ = st;
}

Status ChunkLoad::copy_piece_locked(NvmePiece& p) {
  ZOE_RETURN_IF_ERROR(dev_.copy(dst_.as<char>() + p.dst_off, p.window.data(), p.n * a_.esize(), Stream::kH2D));
  copied_ = dev_.record(Stream::kH2D);
  copy_issued_ = true;
  p.copied = true;
  return Status::Ok();
}

// Called once no read of this load is in flight: no copy can be queued meanwhile.
Status ChunkLoad::settle_copies() {
  std::lock_guard l(mu_);
  Status st;
  if (copy_issued_) st = dev_.wait(copied_);
  copy_issued_ = false;
  for (NvmePiece& p : nvme_)
    if (p.copied) p.window = PinnedPool::Lease();
  return st;
}

Status ChunkLoad::wait_read(const NvmePiece& p) {
  if (a_.ready(p.read)) return a_.wait(p.read);
  ZOE_SPAN("nvme_read", "nvme_read", Bucket::kWaitIo);
  return a_.wait(p.read);
}

void ChunkLoad::retire_copied_locked() {
  std::vector<PinnedPool::Lease> windows;
  for (NvmePiece& p : nvme_)
    if (p.copied && p.window) windows.push_back(std::move(p.window));
  // Copies that ran already (a device whose compute waits on the host, as the CPU's): back now.
  if (!windows.empty() && !dev_.done(copied_)) retirement_->retire(copied_, std::move(windows));
}

// Every piece read and its copy queued. A piece still to be read may need a window this load's
// copies hold: those are given back first, waited for on the host (host_waits) or retired.
Status ChunkLoad::land_pieces(bool host_waits) {
  if (!started_) ZOE_RETURN_IF_ERROR(start());
  Status st = dst_ ? order_after_compute() : Status::Ok();
  for (NvmePiece& p : nvme_) {
    if (!st.ok()) break;
    if (!p.read.valid()) {
      if (host_waits) {
        st = settle_copies();
      } else {
        std::lock_guard l(mu_);
        retire_copied_locked();
      }
      if (st.ok()) st = read_piece(p, true);
      if (!st.ok()) break;
    }
    st = wait_read(p);  // once landed, a piece read with a destination has its copy queued
    std::lock_guard l(mu_);
    if (st.ok() && !p.copied) st = copy_piece_locked(p);  // read while staged
    if (st.ok()) st = copy_error_;
  }
  return st;
}

// As finish(), then the compute stream waits for the copies, and the windows they read go to the
// retirement instead of the host waiting for them.
Status ChunkLoad::finish_for_compute() {
  if (finished_ || (!nvme_.empty() && (!retirement_ || !dst_))) return finish();
  Status st = land_pieces(/*host_waits=*/false);
  if (!st.ok()) {
    (void)drain();  // later pieces' reads may still land and copy
    return st;
  }
  std::lock_guard l(mu_);
  finished_ = true;
  if (!copy_issued_) return Status::Ok();
  copy_issued_ = false;
  st = dev_.wait_on(Stream::kCompute, copied_);
  if (!nvme_.empty()) retire_copied_locked();
  return st;
}

Status ChunkLoad::finish() {
  Status st = land_pieces(/*host_waits=*/true);
  Status c = drain();  // after an error too: later pieces' reads may still land and copy
  return st.ok() ? c : st;
}

}  // namespace zoe

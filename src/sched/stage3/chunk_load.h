// ChunkLoad: elements [e, e + n) of a StateArray on their way into device memory (a gather
// slot). The mechanism under both a fetch and a prefetch, so the two move the same bytes:
//   - memory parts (device or host) are one async copy on the h2d stream, ordered after the
//     compute stream's earlier work (the optimizer may just have written them);
//   - NVMe parts are read into pinned windows by the store's I/O thread, then copied on the h2d
//     stream as each read lands: the I/O thread queues the copy (TransferOptions::landed), so a
//     load ahead moves while the compute runs, not at the scheduler's next call. The thread that
//     needs the unit only waits for the copies. Pieces read without a destination (staged) are
//     copied when the load finishes.
// start() never blocks on the pinned pool: a piece that gets no window now is read in finish().
// A load that is dropped unfinished (a prefetch nobody used) waits for what it issued.
// A load of NVMe parts only may start without a destination (staged on the host while the device
// has no room) and get it before finish().
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include "nvme/pinned_pool.h"
#include "sched/state_array.h"
#include "sched/stage3/unit_load.h"
#include "sched/stage3/window_retirement.h"
#include "zoe/device.h"

namespace zoe {

class ChunkLoad final : public UnitLoad {
 public:
  // window_elems: the most elements one pinned window holds.
  // retirement: where finish_for_compute leaves the windows its copies still read (null: it
  // waits for them on the host, as finish() does).
  ChunkLoad(Device& dev, PinnedPool* pool, const StateArray& a, int64_t e, int64_t n, const Buffer& dst,
            size_t dst_off, int64_t window_elems, WindowRetirement* retirement = nullptr);
  ChunkLoad(const ChunkLoad&) = delete;
  ChunkLoad& operator=(const ChunkLoad&) = delete;
  ~ChunkLoad() override;

  Status start() override;
  // After it the elements are in dst (the h2d stream's copy is waited for).
  Status finish() override;
  // The compute stream waits for the copies, not the host; the windows of NVMe parts go to the
  // retirement, back to the pool once their copies have run (without one: finish()).
  Status finish_for_compute() override;

  // Parts in device or host memory: their copy needs the destination at start().
  bool has_memory_parts() const override { return !memory_.empty(); }
  // Whether start() issued any read (it issues none when the pinned pool has no window free).
  bool reading() const override;
  // Whether start() issued every read (finish() then acquires no pinned window).
  bool all_issued() const override;
  void set_destination(const Buffer& dst) override { dst_ = dst; }
  // Pieces whose copy to the destination is on the h2d stream (tests, stats).
  int copies_issued() const;

 private:
  struct NvmePiece {
    int64_t e, n;
    size_t dst_off;
    PinnedPool::Lease window;
    Ticket read;
    bool copied = false;  // its copy is on the h2d stream; the window is held until that is done
  };
  Status read_piece(NvmePiece& p, bool wait_for_window);
  Status order_after_compute();
  void landed(NvmePiece& p);             // on the I/O thread
  Status copy_piece_locked(NvmePiece& p);  // mu_ held
  Status wait_read(const NvmePiece& p);
  Status land_pieces(bool host_waits);
  // Waits for the copies issued and gives their windows back.
  Status settle_copies();
  // The windows of the pieces copied so far, to the retirement with the last copy's event.
  void retire_copied_locked();  // mu_ held
  Status drain();

  Device& dev_;
  PinnedPool* pool_;
  WindowRetirement* retirement_;
  const StateArray& a_;
  Buffer dst_;
  std::vector<NvmePiece> nvme_;
  struct MemoryPiece {
    int64_t e, n;
    size_t dst_off;
  };
  std::vector<MemoryPiece> memory_;  // device and host-memory parts
  // The copies, queued by the I/O thread (landed) and by finish(): the last one's event.
  mutable std::mutex mu_;
  Event copied_;
  bool copy_issued_ = false;
  Status copy_error_;  // a copy the I/O thread could not queue, for finish() to report
  bool h2d_ordered_ = false, started_ = false, finished_ = false;
};

}  // namespace zoe

// OptimizerWindows: the optimizer's pass over state that lives on NVMe, as pinned windows that
// rotate. Mechanism only: the engine says which sub-groups there are, which arrays are windowed
// and how to step one sub-group; this class reads each sub-group's state into a window ahead of
// Adam, hands the window to the step, writes it back, and after the pass reads the next pass's
// first sub-groups ahead in the background.
//
// Windows: the ones the last pass read ahead for this one (its first sub-groups), then three that
// rotate: sub-group k+1 is read while Adam runs on k, and k-1 is written back. Windows are as
// large as the largest sub-group (sub-groups end at units: often far below the configured size),
// so the pool has room to read ahead. Results are bitwise those of the in-memory pass: the store
// runs a block's requests in submission order, and a read ahead only starts behind the write-backs
// of the blocks it reads.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "nvme/pinned_pool.h"
#include "sched/state_array.h"
#include "sched/optimizer/window_sums.h"
#include "zoe/device.h"

namespace zoe {

// One array of the optimizer's state that has NVMe parts, and where it sits in a window.
struct WindowedArray {
  int slot = 0;            // 0 master, 1 exp_avg, 2 exp_avg_sq, 3 the low-precision parameters
  const StateArray* a = nullptr;
  bool read = false;       // loaded before Adam (state); the low-precision copy is only written
  size_t offset = 0;       // bytes into the window per element of the sub-group (times its length)
  bool hot_sums = false;   // its block sums are made by the host Adam, not the I/O thread (window_sums.h)
};

struct WindowLayout {
  std::vector<WindowedArray> arrays;
  size_t per_elem = 0;              // window bytes per element of a sub-group
  uint64_t pool_keep_per_elem = 0;  // pool bytes per element the next pass needs (not for reading ahead)
};

// Sub-groups [a, b) in optimizer indices, in order.
using SubGroups = std::vector<std::pair<int64_t, int64_t>>;

class OptimizerWindows {
 public:
  // Steps sub-group [a, b): w[slot] is the window of each windowed array on NVMe there (null: that
  // array is in memory there); `hashed` lists the arrays whose block sums the step makes.
  using Step = std::function<Status(int64_t a, int64_t b, const std::array<char*, 4>& w,
                                    const std::vector<HashedArray>* hashed)>;

  // `host_stepped(a)`: whether the host Adam steps the sub-group at a (only it makes block sums).
  OptimizerWindows(Device& dev, PinnedPool& pool, std::function<bool(int64_t)> host_stepped);
  ~OptimizerWindows() { drop_read_ahead(); }

  // The pass: every sub-group through a window, `advanced(b)` once sub-group [.., b)'s write-backs
  // are submitted (later reads of it see them). `written` are the ranges Adam writes, sorted (a
  // write-only window is zero elsewhere: the padding between them). Waits for every transfer it
  // issued, even after an error; then reads the next pass's first sub-groups ahead.
  Status run(const SubGroups& groups, std::span<const std::pair<int64_t, int64_t>> written, const WindowLayout& wl,
             const Step& step, const std::function<void(int64_t)>& advanced);

  // Leases the three rotating windows of the next run() now, from a caller that knows the pool
  // is not held by others that wait for it: a run that waits on the caller (a pass begun in the
  // backward waits for gradients) must not also wait for pool memory the caller's loads hold.
  Status reserve(const SubGroups& groups, const WindowLayout& wl);

  // Drops what was read ahead (before anything else rewrites the state).
  void drop_read_ahead();

  // Blocks whose sums the host Adam made (the pass's thread counts, others read).
  int64_t hashed_blocks() const { return hashed_blocks_.load(); }

 private:
  using ArrayTicket = std::pair<const StateArray*, Ticket>;
  struct Window {
    int64_t a = 0, b = 0;
    PinnedPool::Lease lease;
    std::vector<ArrayTicket> reads, writes;
    std::array<std::shared_ptr<BlockSums>, 4> read_sums, write_sums;
  };
  static int64_t largest(const SubGroups& groups);  // elements of the largest sub-group
  std::array<char*, 4> window_of(const WindowLayout& wl, Window& w, int64_t a, int64_t b);
  void read_window(const WindowLayout& wl, Window& w, int64_t a, int64_t b, bool background);
  Status step_window(const WindowLayout& wl, Window& w, std::span<const std::pair<int64_t, int64_t>> written,
                     const Step& step);
  void read_ahead_next(const SubGroups& groups, const WindowLayout& wl, int64_t largest);
  static Status wait_tickets(std::vector<ArrayTicket>& ts);  // all of them, even after an error

  Device& dev_;
  PinnedPool& pool_;
  std::function<bool(int64_t)> host_stepped_;
  std::vector<Window> read_ahead_;  // the next pass's first sub-groups, read after this one
  std::array<PinnedPool::Lease, 3> reserved_;  // the next run's rotating windows (reserve())
  std::atomic<int64_t> hashed_blocks_{0};
};

}  // namespace zoe

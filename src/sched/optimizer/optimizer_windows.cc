#include "sched/optimizer/optimizer_windows.h"

#include <algorithm>
#include <cstring>

#include "common/profiler.h"

namespace zoe {
namespace {

// Zeros where Adam writes nothing in window [a, b) of a write-only array: the padding between the
// written ranges (sorted), not the whole window.
void zero_gaps(char* w, size_t esize, int64_t a, int64_t b, std::span<const std::pair<int64_t, int64_t>> written) {
  auto first = std::partition_point(written.begin(), written.end(), [&](const auto& r) { return r.second <= a; });
  int64_t at = a;
  for (auto r = first; r != written.end() && r->first < b; ++r) {
    const int64_t lo = std::max(r->first, a);
    if (lo > at) std::memset(w + (at - a) * esize, 0, (lo - at) * esize);
    at = std::max(at, std::min(r->second, b));
  }
  if (b > at) std::memset(w + (at - a) * esize, 0, (b - at) * esize);
}

}  // namespace

OptimizerWindows::OptimizerWindows(Device& dev, PinnedPool& pool, std::function<bool(int64_t)> host_stepped)
    : dev_(dev), pool_(pool), host_stepped_(std::move(host_stepped)) {}

std::array<char*, 4> OptimizerWindows::window_of(const WindowLayout& wl, Window& w, int64_t a, int64_t b) {
  std::array<char*, 4> at{};
  for (const WindowedArray& x : wl.arrays)
    if (x.a->on_nvme(a)) at[x.slot] = reinterpret_cast<char*>(w.lease.data()) + x.offset * (b - a);
  return at;
}

void OptimizerWindows::read_window(const WindowLayout& wl, Window& w, int64_t a, int64_t b, bool background) {
  w.a = a, w.b = b;
  auto at = window_of(wl, w, a, b);
  for (const WindowedArray& x : wl.arrays) {
    w.read_sums[x.slot] = nullptr;
    if (!at[x.slot] || !x.read) continue;
    if (x.hot_sums && host_stepped_(a)) w.read_sums[x.slot] = make_block_sums(*x.a, a, b, /*read=*/true);
    w.reads.push_back({x.a, x.a->read_async(a, b - a, at[x.slot], background, w.read_sums[x.slot])});
  }
}

// Adam over a window whose reads have landed, then its write-backs.
Status OptimizerWindows::step_window(const WindowLayout& wl, Window& w,
                                     std::span<const std::pair<int64_t, int64_t>> written, const Step& step) {
  const int64_t a = w.a, b = w.b;
  auto at = window_of(wl, w, a, b);
  for (const WindowedArray& x : wl.arrays)  // a write-only window holds zeros where Adam writes nothing (padding)
    if (at[x.slot] && !x.read) zero_gaps(at[x.slot], x.a->esize(), a, b, written);
  // Where the host Adam steps the window it makes the block sums of the state and weights as it goes.
  std::vector<HashedArray> hashed;
  for (const WindowedArray& x : wl.arrays) {
    w.write_sums[x.slot] = nullptr;
    if (!at[x.slot] || !x.hot_sums || !host_stepped_(a)) continue;
    w.write_sums[x.slot] = make_block_sums(*x.a, a, b, /*read=*/false);
    hashed_blocks_ += static_cast<int64_t>(w.write_sums[x.slot]->count());
    hashed.push_back({x.a, at[x.slot], x.read ? w.read_sums[x.slot] : nullptr, w.write_sums[x.slot]});
  }
  ZOE_RETURN_IF_ERROR(step(a, b, at, &hashed));
  // The write-backs read the window: the device Adam must be done with it (a GPU runs it async).
  // The CPU Adam is (it returns once its uploads landed), and waiting for the compute stream
  // then would wait for the next forward's kernels too.
  if (!host_stepped_(a)) ZOE_RETURN_IF_ERROR(dev_.wait(dev_.record(Stream::kCompute)));
  // Every write-back goes in the foreground: the window it empties is the one the pass reads
  // into two sub-groups on, so it sets the pass's pace as much as the reads (the store runs the
  // reads first and the writes in the slots they leave); the weights are what the next forward reads.
  for (const WindowedArray& x : wl.arrays)
    if (at[x.slot]) w.writes.push_back({x.a, x.a->write_async(a, b - a, at[x.slot], false, w.write_sums[x.slot])});
  return Status::Ok();
}

Status OptimizerWindows::run(const SubGroups& groups, std::span<const std::pair<int64_t, int64_t>> written,
                             const WindowLayout& wl, const Step& step, const std::function<void(int64_t)>& advanced) {
  std::vector<Window> ahead = std::move(read_ahead_);
  read_ahead_.clear();
  size_t A = 0;
  while (A < ahead.size() && A < groups.size() && ahead[A].a == groups[A].first && ahead[A].b == groups[A].second) ++A;
  const int64_t most = largest(groups);
  ZOE_RETURN_IF_ERROR(reserve(groups, wl));  // a no-op when the caller reserved them
  Window rot[3];
  for (int i = 0; i < 3; ++i) rot[i].lease = std::move(reserved_[i]);
  auto window = [&](size_t k) -> Window& { return k < A ? ahead[k] : rot[(k - A) % 3]; };
  Status st = Status::Ok();
  if (A == 0 && !groups.empty()) read_window(wl, rot[0], groups[0].first, groups[0].second, false);
  for (size_t k = 0; k < groups.size() && st.ok(); ++k) {
    Window& cur = window(k);
    if (k + 1 < groups.size() && k + 1 >= A) {  // a rotating window, last written back two groups ago
      Window& next = window(k + 1);
      {
        ZOE_SPAN("nvme_write", "nvme_write", Bucket::kWaitWrite);
        st = wait_tickets(next.writes);
      }
      if (st.ok()) read_window(wl, next, groups[k + 1].first, groups[k + 1].second, false);
    }
    {
      ZOE_SPAN("nvme_read", "nvme_read", Bucket::kWaitIo);
      if (st.ok()) st = wait_tickets(cur.reads);
    }
    if (st.ok()) st = step_window(wl, cur, written, step);
    if (st.ok()) advanced(groups[k].second);  // its write-backs are submitted: later reads see them
  }
  {
    ZOE_SPAN("nvme_write", "nvme_write", Bucket::kWaitWrite);
    for (Window* w : {&rot[0], &rot[1], &rot[2]}) {  // every transfer is waited for, even after an error
      Status r = wait_tickets(w->reads), wr = wait_tickets(w->writes);
      if (st.ok()) st = r.ok() ? wr : r;
    }
    for (Window& w : ahead) {
      Status r = wait_tickets(w.reads), wr = wait_tickets(w.writes);
      if (st.ok()) st = r.ok() ? wr : r;
    }
  }
  ahead.clear();
  for (Window& w : rot) w.lease = PinnedPool::Lease();
  if (st.ok()) read_ahead_next(groups, wl, most);
  return st;
}

// The next pass's first sub-groups are read now, in the background, behind this pass's
// write-backs (the store keeps a block's requests in order), so those reads overlap the next
// forward and backward. They take what the pool has beyond what the next pass itself needs.
void OptimizerWindows::read_ahead_next(const SubGroups& groups, const WindowLayout& wl, int64_t largest) {
  const uint64_t keep = wl.pool_keep_per_elem * largest + (uint64_t{1} << 20);
  pool_.reclaim_ready();  // parameter loads' windows whose uploads have run
  for (auto [a, b] : groups) {
    const uint64_t bytes = (b - a) * wl.per_elem;
    if (pool_.available() < keep + bytes) return;
    Window w;
    auto lease = pool_.try_acquire(bytes);
    if (!lease.ok() || !lease->data()) return;
    w.lease = std::move(*lease);
    read_window(wl, w, a, b, /*background=*/true);
    read_ahead_.push_back(std::move(w));
  }
}

Status OptimizerWindows::wait_tickets(std::vector<ArrayTicket>& ts) {
  Status first = Status::Ok();
  for (auto& [array, t] : ts) {
    Status st = array->wait(t);  // its own store's
    if (first.ok()) first = st;
  }
  ts.clear();
  return first;
}

int64_t OptimizerWindows::largest(const SubGroups& groups) {
  int64_t most = 0;
  for (auto [a, b] : groups) most = std::max(most, b - a);
  return most;
}

// Windows are as large as the largest sub-group.
Status OptimizerWindows::reserve(const SubGroups& groups, const WindowLayout& wl) {
  const size_t window_bytes = static_cast<size_t>(largest(groups)) * wl.per_elem;
  for (PinnedPool::Lease& l : reserved_)
    if (!l || l.size() < window_bytes) {
      l = PinnedPool::Lease();
      ZOE_ASSIGN_OR_RETURN(l, pool_.acquire(window_bytes));
    }
  return Status::Ok();
}

void OptimizerWindows::drop_read_ahead() {
  for (Window& w : read_ahead_) (void)wait_tickets(w.reads);
  read_ahead_.clear();
}

}  // namespace zoe

#include "sched/stage3/unit_scheduler.h"

#include <algorithm>

namespace zoe {

UnitScheduler::UnitScheduler(Device& dev, UnitMover& mover, std::vector<int64_t> unit_elems, size_t wsize,
                             PrefetchLimits limits, uint64_t budget, bool poison_released)
    : dev_(dev), mover_(mover), elems_(unit_elems), wsize_(wsize), budget_(budget), pool_(dev, poison_released),
      policy_(std::move(unit_elems), limits), units_(elems_.size()), residency_(elems_.size(), Residency::kAbsent) {}

UnitScheduler::Stats UnitScheduler::stats() const {
  Stats s = stats_;
  s.deviations = trace_.deviations();
  return s;
}

uint64_t UnitScheduler::device_free() const { return free_in(dev_.ledger().snapshot()); }

uint64_t UnitScheduler::free_in(const LedgerSnapshot& l) const {
  uint64_t used = dev_.unbooked_bytes(Tier::kDevice);
  for (uint64_t b : l.bytes[static_cast<int>(Tier::kDevice)]) used += b;
  return budget_ > used ? budget_ - used : 0;
}

int64_t UnitScheduler::room() {
  LedgerSnapshot l = dev_.ledger().snapshot();
  uint64_t act = l.bytes[static_cast<int>(Tier::kDevice)][static_cast<int>(Kind::kActivation)];
  activation_peak_ = std::max(activation_peak_, act);
  int64_t bytes = static_cast<int64_t>(free_in(l) + act + pool_.idle_bytes()) -
                  static_cast<int64_t>(reserve_ + activation_peak_);
  return bytes >= 0 ? bytes / static_cast<int64_t>(wsize_) : -1;
}

Result<UnitScheduler::Fetched> UnitScheduler::fetch(int u) {
  Unit& g = units_[u];
  if (g.refs > 0) {  // nested: already gathered
    ++g.refs;
    return Fetched{g.buf.data, false};
  }
  bool left_plan = !trace_.observe(u) && !trace_.plan().empty();
  bool need = residency_[u] != Residency::kGathered;
  AheadGather ahead = ahead_candidate(u);
  ZOE_RETURN_IF_ERROR(mover_.agree_fetch(u, &need, &ahead));
  if (ahead.go) start_gather_ahead(ahead.v);  // every rank that agreed enters it
  bool came_ahead = g.gathering != 0;
  ZOE_RETURN_IF_ERROR(wait_gathered(u));
  stats_.fetched_kept += !need && !came_ahead;
  stats_.fetched_loading +=
      came_ahead || residency_[u] == Residency::kLoading || residency_[u] == Residency::kStaged;
  if (need) ZOE_RETURN_IF_ERROR(gather(u));
  residency_[u] = Residency::kGathered;
  g.refs = 1;
  prefetch();
  keep_reserve_free();
  return Fetched{g.buf.data, left_plan};
}

// Our chunk must be this step's; a gathered unit (kept here, not on another rank) is gathered
// again in place. Nothing half-gathered stays behind.
Status UnitScheduler::gather(int u) {
  Unit& g = units_[u];
  ZOE_RETURN_IF_ERROR(mover_.wait_updated(u));
  if (residency_[u] != Residency::kLoading && residency_[u] != Residency::kGathered) {
    auto buf = gather_buffer(u);
    if (!buf.ok()) {
      (void)unload(u);  // a staged load's windows go back too (it has no gather ahead: waited for)
      return buf.status();
    }
    g.buf = *buf;
    if (g.load) g.load->set_destination(g.buf);  // staged: its reads are on their way
    else g.load = mover_.load(u, g.buf);
  }
  Status st = g.load ? g.load->finish_for_compute() : Status::Ok();
  g.load.reset();
  if (st.ok()) st = mover_.gather(u, g.buf);
  if (!st.ok()) {
    pool_.give_back(g.buf);
    residency_[u] = Residency::kAbsent;
  }
  return st;
}

Status UnitScheduler::release(int u) {
  Unit& g = units_[u];
  if (--g.refs > 0) return Status::Ok();
  int64_t r = room();
  if (!trace_.following() || !policy_.keep(trace_.plan(), trace_.next(), u, residency_, r))
    ZOE_RETURN_IF_ERROR(unload(u));
  prefetch();
  keep_reserve_free();
  return Status::Ok();
}

// room() counts the pool's idle buffers as free, since a gather reuses them; the reserve is for
// what is not a gather (the handed-over gradient, reduction buffers), so it must be free in the
// allocator itself. Which of the two a timing leaves idle is not the policy's business.
void UnitScheduler::keep_reserve_free() {
  if (pool_.idle_bytes() > 0 && device_free() < reserve_) pool_.trim();
}

// Prefetching is an optimisation: whatever fails here (no buffer, a read that cannot start, a
// chunk in memory that cannot be staged) is left to the fetch, which does the same work and
// reports the error. A staged chunk's fetch only uploads and gathers.
void UnitScheduler::prefetch() {
  if (!trace_.following()) return;
  for (AheadLoad a : policy_.ahead(trace_.plan(), trace_.next(), residency_, room())) {
    if (!mover_.updated(a.u)) return;  // not this step's yet
    Unit& g = units_[a.u];
    g.buf = Buffer();
    if (!a.staged) {
      auto buf = pool_.acquire(bytes(a.u));
      if (buf.ok()) g.buf = *buf;
    }
    g.load = mover_.load(a.u, g.buf);
    bool staged = !g.buf;
    if ((staged && g.load->has_memory_parts()) || !g.load->start().ok() || (staged && !g.load->reading())) {
      (void)unload(a.u);  // a load just made, never gathered: nothing to report
      return;
    }
    residency_[a.u] = staged ? Residency::kStaged : Residency::kLoading;
    ++stats_.loads_ahead;
    stats_.staged_ahead += staged;
  }
}

// A gather buffer for a fetch: when the device is full the reductions in flight give theirs
// back, then idle units go in the policy's order.
Result<Buffer> UnitScheduler::gather_buffer(int u) {
  auto b = pool_.acquire(bytes(u));
  if (!b.ok() && b.status().code() == Code::kOutOfMemory) {
    ZOE_RETURN_IF_ERROR(mover_.finish_reductions());
    b = pool_.acquire(bytes(u));
  }
  if (b.ok() || b.status().code() != Code::kOutOfMemory) return b;
  std::vector<int> idle;
  for (int v = 0; v < static_cast<int>(units_.size()); ++v)
    if (v != u && units_[v].refs == 0 && residency_[v] != Residency::kAbsent && units_[v].buf) idle.push_back(v);
  size_t next = trace_.following() ? trace_.next() : trace_.plan().size();
  for (int v : policy_.evict_order(trace_.plan(), next, std::move(idle))) {
    ZOE_RETURN_IF_ERROR(unload(v));  // its buffer goes back to the pool, which frees idle ones when full
    ++stats_.evicted;
    b = pool_.acquire(bytes(u));
    if (b.ok() || b.status().code() != Code::kOutOfMemory) break;
  }
  return b;
}

Status UnitScheduler::unload(int u) {
  Unit& g = units_[u];
  Status gathered = wait_gathered(u);
  g.load.reset();  // waits for its reads and copies (a load ahead that failed was never used)
  pool_.give_back(g.buf);
  residency_[u] = Residency::kAbsent;
  return gathered;
}

Status UnitScheduler::unload_all() {
  Status first;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    if (units_[u].refs == 0 && residency_[u] != Residency::kAbsent) {
      Status st = unload(u);
      if (first.ok()) first = st;
    }
  return first;
}

Status UnitScheduler::drop_idle() {
  pool_.trim();
  Status first = unload_all();
  pool_.trim();
  return first;
}

void UnitScheduler::clear() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    units_[u].refs = 0;
    (void)unload(u);
  }
  pool_.trim();
}

// The unit the plan fetches after u, and whether this rank could gather it right away: gathered
// already, or its chunk loading into a gather buffer with every read issued (so the
// communication thread, which finishes the load, never waits for a pinned window).
AheadGather UnitScheduler::ahead_candidate(int u) const {
  AheadGather a;
  if (!mover_.gathers_ahead() || !trace_.following()) return a;
  int v = policy_.gather_ahead(trace_.plan(), trace_.next(), u);
  if (v < 0) return a;
  const Unit& g = units_[v];
  a.v = v;
  a.needs = residency_[v] != Residency::kGathered;
  a.ready = g.gathering == 0 && g.refs == 0 &&
            (residency_[v] == Residency::kGathered ||
             (residency_[v] == Residency::kLoading && g.load && g.load->all_issued()));
  return a;
}

void UnitScheduler::start_gather_ahead(int v) {
  Unit& g = units_[v];
  g.gathering = mover_.gather_ahead(v, g.load.get(), g.buf);
  residency_[v] = Residency::kGathered;
  ++stats_.gathered_ahead;
}

Status UnitScheduler::wait_gathered(int u) {
  Unit& g = units_[u];
  if (!g.gathering) return Status::Ok();
  Status st = mover_.wait_gather(u, g.gathering);
  g.gathering = 0;
  g.load.reset();
  if (!st.ok()) {  // nothing half-gathered stays behind
    pool_.give_back(g.buf);
    residency_[u] = Residency::kAbsent;
  }
  return st;
}

}  // namespace zoe

#include "sched/optimizer/optimizer_pass.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "common/profiler.h"
#include "common/status_of_call.h"

namespace zoe {

// One tensor segment of the optimizer range (or the part of one inside a sub-group).
struct OptimizerPass::Task {
  int64_t e = 0, n = 0;  // optimizer index of the first element, and the count
  bool decay = false;
  const char* grad = nullptr;
  int u = 0;
  int64_t x = 0;  // unit-relative element of the first
};

// Sub-groups in pass order (by unit, ascending or descending; each inside one unit), and per
// unit how many sub-groups are done once it is (UpdateProgress counts sub-groups).
struct OptimizerPass::Plan {
  std::vector<Task> tasks;
  WindowLayout wl;
  SubGroups groups;
  std::vector<int> group_unit;
  std::vector<int64_t> done_at;
};

OptimizerPass::OptimizerPass(RankState& state, Device& dev)
    : s_(state), dev_(dev), worker_([this] { run_worker(); }) {}

OptimizerPass::~OptimizerPass() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // A pass begun in the backward whose step never came waits at a gate: it ends unapplied.
  if (in_backward()) cancel();
  worker_.join();  // after the pass in flight (and one queued)
  // Callers learn a pass's failure from a wait; one that never asked (a framework that frees the
  // engine after its last step) is told here rather than not at all.
  if (Status lost = progress_.take_unreported(); !lost.ok() && !cancelled_)
    std::fprintf(stderr, "zoe: error: the engine's last optimizer update failed and no call returned it: %s\n",
                 lost.message().c_str());
  dev_.free(nonfinite_);
}

Status OptimizerPass::allocate() {
  ZOE_ASSIGN_OR_RETURN(nonfinite_, dev_.alloc(sizeof(uint64_t), Tier::kDevice, Kind::kStaging));
  if (s_.pool())
    windows_ = std::make_unique<OptimizerWindows>(dev_, *s_.pool(), [this](int64_t a) { return host_stepped(a); });
  return reset_counts();
}

// One persistent thread for every step's pass (not a thread per step): it waits for start().
void OptimizerPass::run_worker() {
  Profiler::exclude_thread_from_buckets();  // the step's buckets count where it waits for this
  Profiler::name_thread("optimizer");
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || queued_; });
    if (!queued_) return;
    queued_ = false;
    const AdamHyper h = next_;
    const Plan* p = next_plan_;
    const bool gated = next_gated_;
    l.unlock();
    progress_.finish(status_of_call("optimizer pass", [&] { return run(h, *p, gated); }));
    l.lock();
  }
}

void OptimizerPass::start(const AdamHyper& h) { begin(h, false); }

void OptimizerPass::start_in_backward(const AdamHyper& h) { begin(h, true); }

void OptimizerPass::begin(const AdamHyper& h, bool in_backward) {
  current_ = &plan(in_backward);
  in_backward_ = awaiting_step_ = in_backward;
  cancelled_ = false;
  opened_this_pass_ = 0;
  gates_.reset(s_.layout().num_units());
  ready_.assign(static_cast<size_t>(s_.layout().num_units()), dev_.record(Stream::kCompute));
  progress_.start();
  {
    std::lock_guard<std::mutex> l(mu_);
    next_ = h;
    next_plan_ = current_;
    next_gated_ = in_backward;
    queued_ = true;
  }
  cv_.notify_all();
}

// The pass's error (the cancellation, or one met before) is dropped: the caller reports the step
// as not applied, and the next pass starts from a clean slate.
void OptimizerPass::cancel() {
  cancelled_ = true;
  awaiting_step_ = false;
  gates_.cancel();
  (void)wait();
  progress_.finish(Status::Ok());
}

Status OptimizerPass::reserve_windows() {
  const Plan& p = plan(true);
  if (!windows_ || p.wl.arrays.empty()) return Status::Ok();
  return windows_->reserve(p.groups, p.wl);
}

Status OptimizerPass::wait() { return progress_.wait_until(std::numeric_limits<int64_t>::max()); }

// Unit u is updated once the pass has done the sub-groups up to its last.
Status OptimizerPass::wait_for_unit(int u) {
  if (!progress_.running()) return wait();
  if (not_begun(u)) return Status::Ok();  // the weights are this step's
  ZOE_SPAN("wait update " + s_.layout().unit(u).name, "adam", Bucket::kWaitIo);
  return progress_.wait_until(current_->done_at[u]);
}

bool OptimizerPass::updated(int u) const {
  if (!current_) return true;  // no pass yet
  if (progress_.running() && not_begun(u)) return true;
  return progress_.updated(current_->done_at[u]);
}

const OptimizerPass::Plan& OptimizerPass::plan(bool reverse) {
  std::unique_ptr<Plan>& p = plans_[reverse];
  if (p) return *p;
  p = std::make_unique<Plan>();
  p->tasks = tasks();
  p->wl = window_layout();
  std::vector<int> unit_of;
  SubGroups asc = groups(p->tasks, !p->wl.arrays.empty(), &unit_of);
  std::vector<size_t> order(asc.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  // Descending units, each unit's sub-groups still in index order (windows read forward).
  if (reverse) std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return unit_of[x] > unit_of[y]; });
  for (size_t k : order) {
    p->groups.push_back(asc[k]);
    p->group_unit.push_back(unit_of[k]);
  }
  const int n = s_.layout().num_units();
  p->done_at.assign(n, 0);
  for (int u = 0; u < n; ++u)
    for (int v : p->group_unit) p->done_at[u] += reverse ? v >= u : v <= u;
  return *p;
}

Result<OptimizerPass::Counts> OptimizerPass::counts() {
  Counts c;
  ZOE_RETURN_IF_ERROR(dev_.download(&c.nonfinite, nonfinite_.data, sizeof(uint64_t)));
  c.nonfinite += host_nonfinite_;
  c.host_stepped = host_stepped_;
  return c;
}

Status OptimizerPass::reset_counts() {
  host_nonfinite_ = 0;
  host_stepped_ = 0;
  return dev_.zero(nonfinite_.data, sizeof(uint64_t));
}

// Pinned host memory for a host-stepped sub-group's device-memory parts, per element: its
// gradients, its fp32 weights (fp32 training) and its low-precision weight copy; only what some
// array keeps in device memory (nothing when all of it is host memory or NVMe windows).
class OptimizerPass::HostStaging {
 public:
  explicit HostStaging(Device& dev) : dev_(dev) {}
  ~HostStaging() { dev_.free(buf_); }
  Status prepare(const RankState& s, const SubGroups& groups) {
    int64_t most = 0;
    for (auto [a, b] : groups)
      if (!s.exp_avg().in_device_memory(a)) most = std::max(most, b - a);
    grad_bytes_ = s.grads_on_host() ? 0 : s.gsize();  // host gradients are read in place
    master_bytes_ = s.master().split() > 0 ? 4 : 0;
    weight_bytes_ = s.config().mixed_precision() && s.param().split() > 0 ? s.wsize() : 0;
    size_t per = grad_bytes_ + master_bytes_ + weight_bytes_;
    if (most == 0 || per == 0) return Status::Ok();
    ZOE_ASSIGN_OR_RETURN(buf_, dev_.alloc(most * per, Tier::kHost, Kind::kStaging));
    return Status::Ok();
  }
  char* grads() const { return buf_.as<char>(); }
  char* masters(int64_t n) const { return grads() + n * grad_bytes_; }
  char* weights(int64_t n) const { return masters(n) + n * master_bytes_; }

 private:
  Device& dev_;
  Buffer buf_;
  size_t grad_bytes_ = 0, master_bytes_ = 0, weight_bytes_ = 0;
};

std::vector<OptimizerPass::Task> OptimizerPass::tasks() const {
  std::vector<Task> out;
  for (int u = 0; u < s_.layout().num_units(); ++u) {
    const UnitSlot& s = s_.layout().slot(u);
    int64_t lo = s_.opt_begin(u), hi = s_.opt_end(u);
    const char* g = s_.plan().shard_optimizer ? s_.grad_ptr(s_.grad_owned_offset(u)) : s_.grad_ptr(s.full_offset);
    for (const Segment& seg : s_.layout().segments(u, lo, hi))
      out.push_back({s_.opt_index(u, lo + seg.begin), seg.end - seg.begin, seg.decay, g + seg.begin * s_.gsize(), u,
                     lo + seg.begin});
  }
  return out;
}

// In fp32 training the master is the parameter array itself (slot 0), never also slot 3.
WindowLayout OptimizerPass::window_layout() {
  WindowLayout wl;
  StateArray* slots_of[4] = {&s_.master(), &s_.exp_avg(), &s_.exp_avg_sq(),
                             s_.plan().shard_params && s_.config().mixed_precision() ? &s_.param() : nullptr};
  // The arrays segmented as the first fp32 one have nesting block grids (the weights' block is two
  // of the state's): the host Adam makes their sums (window_sums.h).
  const StateArray* grid = nullptr;
  for (int i = 0; i < 4; ++i)
    if (slots_of[i] && slots_of[i]->has_nvme() && slots_of[i]->esize() == 4) {
      grid = slots_of[i];
      break;
    }
  for (int i = 0; i < 4; ++i)
    if (slots_of[i] && slots_of[i]->has_nvme()) {
      const StateArray& x = *slots_of[i];
      const bool hot = s_.config().checksums && grid && 4 % x.esize() == 0 && x.same_segments(*grid);
      wl.arrays.push_back({i, slots_of[i], i < 3, wl.per_elem, hot});
      wl.per_elem += x.esize();
    }
  wl.pool_keep_per_elem = s_.pool_bytes_per_elem(wl.per_elem);
  return wl;
}

// Sub-groups: at most s_.group_elems() when streaming, sub_group_size where the state is in host
// memory (its gradients are staged there), cut where any array changes part and where a unit
// ends (the next forward waits for its units one by one).
SubGroups OptimizerPass::groups(const std::vector<Task>& tasks, bool streaming, std::vector<int>* units) {
  auto limit = [&](int64_t e) {
    return streaming ? s_.group_elems() : s_.exp_avg().in_device_memory(e) ? int64_t{1} << 60 : s_.config().sub_group_size;
  };
  SubGroups out;
  for (const Task& t : tasks)
    for (int64_t e = t.e; e < t.e + t.n;) {
      if (out.empty() || e >= out.back().second) {
        int64_t b = e + limit(e);
        for (StateArray* a : {&s_.master(), &s_.exp_avg(), &s_.exp_avg_sq()}) b = std::min(b, a->part_end(e));
        if (s_.plan().shard_params) b = std::min(b, s_.param().part_end(e));
        b = std::min(b, s_.opt_stop(t.u));
        out.push_back({e, b});
        units->push_back(t.u);
      }
      e = std::min(t.e + t.n, out.back().second);
    }
  return out;
}

// Adam over the rank's optimizer range in sub-groups [a, b) that never cross a part boundary of
// any array: memory parts are stepped in place, NVMe parts through windows of pinned memory.
Status OptimizerPass::run(const AdamHyper& h, const Plan& p, bool gated) {
  ZOE_SPAN("adam", "adam", Bucket::kOptimizer);
  const std::vector<Task>& ts = p.tasks;
  const SubGroups& gs = p.groups;
  // ZeRO-Offload: sub-groups whose state is not device memory are stepped by the CPU Adam on the
  // host, their gradients staged in pinned host memory (see run_host_group).
  HostStaging staging(dev_);
  ZOE_RETURN_IF_ERROR(staging.prepare(s_, gs));
  size_t k = 0;  // the sub-group stepped next: both walks below go through gs in order
  OptimizerWindows::Step step_group = [&](int64_t a, int64_t b, const std::array<char*, 4>& w,
                                          const std::vector<HashedArray>* hashed) {
    if (k >= gs.size() || gs[k].first != a) return Status::Runtime("optimizer pass: sub-groups out of order (a bug)");
    const int u = p.group_unit[k++];
    if (gated) {
      ZOE_SPAN("wait gradient " + s_.layout().unit(u).name, "adam", Bucket::kOptimizer);
      ZOE_RETURN_IF_ERROR(gates_.wait(u));
    }
    return host_stepped(a) ? run_host_group(ts, a, b, w, h, staging, hashed, ready_[u])
                           : run_device_group(ts, a, b, w, h);
  };
  int64_t done = 0;
  if (!p.wl.arrays.empty()) {
    std::vector<std::pair<int64_t, int64_t>> written;  // sorted: tasks are in optimizer order
    for (const Task& t : ts) written.push_back({t.e, t.e + t.n});
    return windows_->run(gs, written, p.wl, step_group, [&](int64_t) { progress_.advance(++done); });
  }
  for (auto [a, b] : gs) {  // all in memory: in place
    ZOE_RETURN_IF_ERROR(step_group(a, b, {}, nullptr));
    progress_.advance(++done);
  }
  return Status::Ok();
}

// The Adam ranges of the parts of `tasks` inside optimizer indices [a, b). win[i] holds element a
// of master, exp_avg, exp_avg_sq and the low-precision parameters when that array is in a window
// for this sub-group; null means it is in memory. Each range also says where its master and its
// weight copy are (array indices), for the host path to stage what is device memory.
std::vector<OptimizerPass::GroupRange> OptimizerPass::group_ranges(const std::vector<Task>& tasks, int64_t a,
                                                                   int64_t b, const std::array<char*, 4>& win) {
  StateArray* arrays[3] = {&s_.master(), &s_.exp_avg(), &s_.exp_avg_sq()};
  auto at = [&](int i, int64_t e) { return win[i] ? win[i] + (e - a) * arrays[i]->esize() : arrays[i]->ptr(e); };
  std::vector<GroupRange> out;
  for (const Task& t : tasks) {
    int64_t e0 = std::max(t.e, a), e1 = std::min(t.e + t.n, b);
    if (e0 >= e1) continue;
    int64_t x = t.x + (e0 - t.e);  // unit element of e0
    GroupRange g;
    g.e = e0;
    AdamRange& r = g.r;
    r.decay = t.decay;
    r.grad = t.grad + (e0 - t.e) * s_.gsize();
    r.grad_dtype = s_.gdtype();
    // In fp32 training the master is the parameter array, indexed by parameter position (the
    // same as the optimizer's only at stages 0 and 3, the only ones where it may be windowed).
    g.master_at = s_.config().mixed_precision() || win[0] ? e0 : s_.param_index(t.u, x);
    g.param_at = s_.param_index(t.u, x);
    r.master =
        reinterpret_cast<float*>(s_.config().mixed_precision() || win[0] ? at(0, e0) : s_.param().ptr(g.param_at));
    r.exp_avg = reinterpret_cast<float*>(at(1, e0));
    r.exp_avg_sq = reinterpret_cast<float*>(at(2, e0));
    if (s_.config().mixed_precision())
      r.param_out = win[3] ? win[3] + (e0 - a) * s_.wsize() : s_.param().ptr(g.param_at);
    r.param_dtype = s_.dtype();
    r.n = e1 - e0;
    out.push_back(g);
  }
  return out;
}

// Sub-group [a, b) in device memory (or device-reachable windows): one launch of the device kernel.
Status OptimizerPass::run_device_group(const std::vector<Task>& tasks, int64_t a, int64_t b,
                                       const std::array<char*, 4>& win, const AdamHyper& h) {
  std::vector<AdamRange> ranges;
  for (const GroupRange& g : group_ranges(tasks, a, b, win)) ranges.push_back(g.r);
  return dev_.adam(h, ranges.data(), ranges.size(), nonfinite_.as<uint64_t>());
}

// The CPU Adam (AVX-512 / AVX2, chosen at run time) over sub-group [a, b), whose state is host
// memory or an NVMe window: device gradients come down into `staging` first (host ones,
// s_.grads_on_host(), are read in place); arrays still in device memory (the weight copy; the fp32
// weights in fp32 training) are stepped in staging and go back up. Bitwise the device kernel's
// result: all Adam paths agree bit for bit.
Status OptimizerPass::run_host_group(const std::vector<Task>& tasks, int64_t a, int64_t b,
                                     const std::array<char*, 4>& win, const AdamHyper& h, const HostStaging& staging,
                                     const std::vector<HashedArray>* hashed, Event ready) {
  char* grads = staging.grads();
  char* masters = staging.masters(b - a);  // fp32 weights staged from device memory
  char* weights = staging.weights(b - a);  // low-precision copies staged for device memory
  struct Up {
    void* dst;
    const void* src;
    size_t bytes;
  };
  std::vector<GroupRange> ranges = group_ranges(tasks, a, b, win);
  std::vector<Up> ups;
  ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kD2H, ready));  // gradients are done
  int64_t k = 0;  // staging offset of the range, in elements
  for (GroupRange& g : ranges) {
    AdamRange& r = g.r;
    if (!s_.grads_on_host()) {
      ZOE_RETURN_IF_ERROR(dev_.copy(grads + k * s_.gsize(), r.grad, r.n * s_.gsize(), Stream::kD2H));
      r.grad = grads + k * s_.gsize();
    }
    if (!win[0] && s_.master().in_device_memory(g.master_at)) {
      float* staged = reinterpret_cast<float*>(masters + k * 4);
      ZOE_RETURN_IF_ERROR(dev_.copy(staged, r.master, r.n * 4, Stream::kD2H));
      ups.push_back({r.master, staged, r.n * 4});
      r.master = staged;
    }
    if (r.param_out && !win[3] && s_.param().in_device_memory(g.param_at)) {
      ups.push_back({r.param_out, weights + k * s_.wsize(), r.n * s_.wsize()});
      r.param_out = weights + k * s_.wsize();
    }
    k += static_cast<int64_t>(r.n);
  }
  ZOE_RETURN_IF_ERROR(dev_.wait(dev_.record(Stream::kD2H)));
  for (const GroupRange& g : ranges) host_stepped_ += static_cast<int64_t>(g.r.n);
  if (hashed && !hashed->empty()) {
    std::vector<IndexedAdamRange> indexed;
    for (const GroupRange& g : ranges) indexed.push_back({g.e, g.r});
    ZOE_ASSIGN_OR_RETURN(size_t bad, adam_with_block_sums(h, indexed, a, b, *hashed));
    host_nonfinite_ += bad;
  } else {
    for (const GroupRange& g : ranges) host_nonfinite_ += adam_step(h, g.r, best_isa());
  }
  // The weights go back up after the kernels that read the old ones: in a pass begun in the
  // backward the compute stream may still be reading them (queued before the unit's hand-over,
  // so before `ready`); what is queued after reads this unit only once its update is done.
  if (!ups.empty()) ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kH2D, ready));
  for (const Up& u : ups) ZOE_RETURN_IF_ERROR(dev_.copy(u.dst, u.src, u.bytes, Stream::kH2D));
  // The staging is reused by the next sub-group, and the compute stream reads the weights next.
  Event up = dev_.record(Stream::kH2D);
  ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kCompute, up));
  return dev_.wait(up);
}


}  // namespace zoe

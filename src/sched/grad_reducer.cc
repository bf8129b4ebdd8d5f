#include "sched/grad_reducer.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/profiler.h"

namespace zoe {

GradReducer::GradReducer(RankState& state, OptimizerPass& pass, Agreement& agreement, Device& dev, Comm& comm)
    : s_(state), pass_(pass), agreement_(agreement), dev_(dev), comm_(comm) {
  agreement_.set_reduce([this](int v, const float* grad) { return reduce_sharded(v, grad); });
  const int n = s_.layout().num_units();
  local_seen_.assign(n, 0);
  reduced_.assign(n, 0);
  handed_here_.assign(n, 0);
  summed_.assign(n, 0);
}

GradReducer::~GradReducer() {
  (void)finish();
  dev_.free(sumsq_);
  dev_.free(unit_sumsq_);
}

Status GradReducer::allocate() {
  ZOE_ASSIGN_OR_RETURN(sumsq_, dev_.alloc(sizeof(double), Tier::kDevice, Kind::kStaging));
  // The norm's shares made at the hand-over: only where reduce_alone makes them (one rank, no
  // accumulation), so that no other configuration's device budget pays for them.
  if (comm_.size() == 1 && s_.plan().shard_grads && s_.config().grad_accum == 1) {
    ZOE_ASSIGN_OR_RETURN(unit_sumsq_, dev_.alloc(summed_.size() * sizeof(double), Tier::kDevice, Kind::kStaging));
  }
  return Status::Ok();
}

Status GradReducer::hand_over(int u, const float* grad) {
  if (!s_.plan().shard_grads) {  // accumulate locally; reduced once in step()
    ZOE_RETURN_IF_ERROR(pass_.wait_for_unit(u));  // the update still reads this unit's gradient
    const UnitSlot& s = s_.layout().slot(u);
    ZOE_RETURN_IF_ERROR(
        dev_.accumulate(s_.grad_ptr(s.full_offset), s_.gdtype(), grad, DType::kF32, s.numel, local_seen_[u] > 0));
    ++local_seen_[u];  // only once the gradient is really in
    ++handed_here_[u];
    return Status::Ok();
  }
  Status st = agreement_.agree(Agreement::Call::kGrads, u, grad);
  handed_here_[u] += st.ok();
  return st;
}

Status GradReducer::reduce_replicated(int u) {
  const UnitSlot& s = s_.layout().slot(u);
  ZOE_SPAN("reduce_scatter " + name(u), "reduce_scatter", Bucket::kWaitComm);
  return comm_.reduce_scatter(s_.grad_ptr(s.full_offset), s_.grad_ptr(s_.grad_owned_offset(u)), s.chunk, s_.gdtype());
}

Status GradReducer::reduce_rest(double* handed) {
  const bool sharded = s_.plan().shard_grads;
  for (int u = 0; u < s_.layout().num_units(); ++u) {
    const UnitSlot& s = s_.layout().slot(u);
    int seen = sharded ? reduced_[u] : local_seen_[u];
    *handed += seen;
    if (seen == 0) {  // a unit without gradient this step contributes zeros
      summed_[u] = 0;
      ZOE_RETURN_IF_ERROR(dev_.zero(s_.grad_ptr(sharded ? s.shard_offset : s.full_offset),
                                    (sharded ? s.chunk : s.full_size) * s_.gsize()));
    }
    if (!sharded) ZOE_RETURN_IF_ERROR(reduce_replicated(u));
  }
  return Status::Ok();
}

// Sharded gradients: this micro-step's gradient of unit u (zeros when grad is null) is reduced;
// only our chunk is kept, summed into what earlier reductions this step left there. With a
// communication thread the reduction runs there while the caller's backward goes on.
Status GradReducer::reduce_sharded(int u, const float* grad) {
  if (pass_.in_backward() && pass_.gate_open(u))
    return Status::Invalid(fmt::format("grads_ready: unit '{}' handed over again after its update began "
                                       "(zoe.update_in_backward: at most gradient_accumulation_steps "
                                       "hand-overs of a unit per step)", name(u)));
  ZOE_RETURN_IF_ERROR(pass_.wait_for_unit(u));  // any unit: other ranks' hand-overs are served here too
  if (comm_.size() == 1 && reduced_[u] == 0) return reduce_alone(u, grad);
  summed_[u] = 0;  // the reduction below rewrites the owned chunk
  const UnitSlot& s = s_.layout().slot(u);
  auto alloc = [&] { return dev_.alloc(s.full_size * s_.gsize(), Tier::kDevice, Kind::kComm); };
  Result<Buffer> got = after_reductions_if_full(alloc);
  if (!got.ok() && got.status().code() == Code::kOutOfMemory && make_room_) {
    ZOE_RETURN_IF_ERROR(make_room_());
    got = alloc();
  }
  if (!got.ok() && got.status().code() == Code::kOutOfMemory)
    return got.status().prefixed(fmt::format("unit '{}': its gradient's reduction buffer ({} bytes; the reductions "
                                             "in flight finished and idle units went first): ",
                                             name(u), s.full_size * s_.gsize()));
  ZOE_ASSIGN_OR_RETURN(Buffer buf, std::move(got));
  Status st = grad ? dev_.accumulate(buf.data, s_.gdtype(), grad, DType::kF32, s.numel, false)
                   : dev_.zero(buf.data, s.numel * s_.gsize());
  if (st.ok()) st = dev_.zero(buf.as<char>() + s.numel * s_.gsize(), (s.full_size - s.numel) * s_.gsize());
  CommWorker::Job job = reduction_job(u, buf, reduced_[u] == 0);
  // The step's last reduction into the owned chunk makes the gradient final: an update begun in
  // the backward may step the unit once it is done.
  const bool last = reduced_[u] + 1 == s_.config().grad_accum;
  if (!st.ok() || !worker_) {
    if (st.ok()) st = job(comm_);
    dev_.free(buf);
    if (st.ok()) ++reduced_[u];
    if (st.ok() && last) pass_.open(u);
    return st;
  }
  ++reduced_[u];
  reducing_.push_back({worker_->submit(std::move(job)), buf, s.full_size, u, last});
  reducing_elems_ += s.full_size;
  ++async_;
  // In flight after a hand-over: one unit's reduction (the device reserve holds its buffer beside
  // the next unit's) of at most reduce_bucket_size elements.
  return reap(1, s_.config().reduce_bucket_size);
}

// One rank, the step's first reduction of u: the reduce-scatter is the identity and the owned
// chunk the whole gradient (no padding at one rank), so the gradient goes there in one conversion,
// with no buffer, copy or job: the same bits, the gradient rounded once to the gradient dtype.
// Later micro-steps take the general path (it rounds the new gradient before adding it).
Status GradReducer::reduce_alone(int u, const float* grad) {
  const UnitSlot& s = s_.layout().slot(u);
  char* dst = s_.grad_ptr(s_.grad_owned_offset(u));
  summed_[u] = 0;
  if (grad && unit_sumsq_) {  // final (no accumulation): its share of the norm is made on the way
    double* sum = unit_sumsq_.as<double>() + u;
    ZOE_RETURN_IF_ERROR(dev_.zero(sum, sizeof(double)));
    ZOE_RETURN_IF_ERROR(dev_.convert_sum_squares(dst, s_.gdtype(), grad, s.numel, sum));
    summed_[u] = 1;
    ++summed_at_hand_over_;
  } else {
    ZOE_RETURN_IF_ERROR(grad ? dev_.accumulate(dst, s_.gdtype(), grad, DType::kF32, s.numel, false)
                             : dev_.zero(dst, s.numel * s_.gsize()));
  }
  ++reduced_[u];
  if (reduced_[u] == s_.config().grad_accum) pass_.open(u);
  return Status::Ok();
}

// The reduce-scatter of a unit's gradient in `buf` into our owned chunk: the first of a step
// writes it, later micro-steps' add to it (in the gradient dtype, as the serial order did).
// Collectives move device memory only: a host gradient shard gets the reduced chunk in `buf`
// by a copy (the first), or by a kernel adding it (device-reachable host memory).
CommWorker::Job GradReducer::reduction_job(int u, const Buffer& buf, bool first) {
  const UnitSlot& s = s_.layout().slot(u);
  char* dst = s_.grad_ptr(s_.grad_owned_offset(u));
  char* own = buf.as<char>() + comm_.rank() * s.chunk * s_.gsize();
  bool direct = first && !s_.grads_on_host();
  return [this, name = name(u), src = buf.data, dst, own, chunk = s.chunk, first, direct](Comm& c) {
    ZOE_SPAN("reduce_scatter " + name, "reduce_scatter", Bucket::kWaitComm);
    Status st = c.reduce_scatter(src, direct ? dst : own, chunk, s_.gdtype());
    // On the collective's stream: in its order, whichever thread and stream that is.
    const Stream after = c.tensor_stream();
    if (st.ok() && !direct)
      st = first ? dev_.copy(dst, own, chunk * s_.gsize(), after)
                 : dev_.accumulate(dst, s_.gdtype(), own, s_.gdtype(), chunk, true, after);
    return st;
  };
}

// An allocation that finds the device full is tried once more after the reductions in flight
// have given their buffers back.
Result<Buffer> GradReducer::after_reductions_if_full(const std::function<Result<Buffer>()>& alloc) {
  auto b = alloc();
  if (b.ok() || b.status().code() != Code::kOutOfMemory || reducing_.empty()) return b;
  ZOE_RETURN_IF_ERROR(finish());
  return alloc();
}

// The first error is returned; every buffer goes back anyway.
Status GradReducer::reap(size_t units, int64_t elems) {
  Status first;
  while (!reducing_.empty() && (reducing_.size() > units || reducing_elems_ > elems)) {
    Reduction r = reducing_.front();
    reducing_.pop_front();
    Status st;
    {
      ZOE_SPAN("wait reduce_scatter", "reduce_scatter", Bucket::kWaitComm);
      st = worker_->wait(r.ticket);
    }
    dev_.free(r.buf);
    reducing_elems_ -= r.elems;
    if (st.ok() && r.last) pass_.open(r.u);
    if (first.ok()) first = st;
  }
  if (worker_) comm_.add_bytes(worker_->take_bytes());
  return first;
}

// Every rank is at step() (after the step's agreement): the units each handed over must be the
// same, else all fail alike and the step's gradients are dropped.
Status GradReducer::check_matching() {
  const int n = s_.layout().num_units(), ranks = comm_.size();
  if (ranks == 1) return Status::Ok();
  std::vector<uint8_t> mine(n), all(static_cast<size_t>(n) * ranks);
  for (int u = 0; u < n; ++u) mine[u] = handed_here_[u] > 0;
  ZOE_RETURN_IF_ERROR(comm_.all_gather_control(mine.data(), all.data(), n));
  for (int u = 0; u < n; ++u)
    for (int r = 1; r < ranks; ++r) {
      if (all[static_cast<size_t>(r) * n + u] == all[u]) continue;
      drop();
      int with = all[u] ? 0 : r, without = all[u] ? r : 0;
      return Status::Runtime(fmt::format(
          "step(): rank {} handed over a gradient of unit '{}' and rank {} did not: every rank must hand over the "
          "same units (zeros where it has none); this step's gradients are dropped and no update is applied",
          with, name(u), without));
    }
  return Status::Ok();
}

// The next hand-over of every unit starts afresh (overwrites instead of adding).
void GradReducer::drop() {
  (void)finish();  // nothing may still write an owned chunk
  std::fill(local_seen_.begin(), local_seen_.end(), 0);
  std::fill(reduced_.begin(), reduced_.end(), 0);
  std::fill(handed_here_.begin(), handed_here_.end(), 0);
}

// One kernel over every owned chunk, one 8-byte read-back, then the all-reduce in rank order;
// *handed (this rank's hand-over count) is summed over ranks in the same all-reduce. Where
// hand-overs made units' shares (one rank, no accumulation: reduce_alone), the rest are summed a
// span each and the shares added in unit order on the host instead: on the CPU device the bits
// of the one kernel (the same per-span sums in the same order), without a pass after the backward.
Result<double> GradReducer::owned_sumsq(double* handed) {
  const int n = s_.layout().num_units();
  std::vector<ArrayView> spans;
  for (int u = 0; u < n; ++u)
    spans.push_back({s_.grad_ptr(s_.grad_owned_offset(u)), s_.gdtype(),
                     static_cast<size_t>(s_.layout().owned_real(u, comm_.rank()))});
  double v[2] = {0, *handed};
  if (std::find(summed_.begin(), summed_.end(), 1) == summed_.end()) {
    double* sumsq = sumsq_.as<double>();
    ZOE_RETURN_IF_ERROR(dev_.zero(sumsq, sizeof(double)));
    ZOE_RETURN_IF_ERROR(dev_.sum_squares(spans.data(), spans.size(), sumsq));
    ZOE_RETURN_IF_ERROR(dev_.download(&v[0], sumsq, sizeof(double)));
  } else {
    double* sums = unit_sumsq_.as<double>();
    for (int u = 0; u < n; ++u) {
      if (summed_[u]) continue;
      ZOE_RETURN_IF_ERROR(dev_.zero(sums + u, sizeof(double)));
      ZOE_RETURN_IF_ERROR(dev_.sum_squares(&spans[u], 1, sums + u));
    }
    std::vector<double> share(n);
    ZOE_RETURN_IF_ERROR(dev_.download(share.data(), sums, n * sizeof(double)));
    for (double x : share) v[0] += x;
  }
  ZOE_RETURN_IF_ERROR(comm_.all_reduce_sum(v, 2));
  *handed = v[1];
  return v[0];
}

}  // namespace zoe

#include "sched/zero_engine.h"

#include <cmath>
#include <algorithm>

#include <fmt/format.h>

#include "common/profiler.h"
#include "cpu/adam.h"

namespace zoe {

Result<std::unique_ptr<Engine>> Engine::create(const Config& c, Device& d, Comm& comm, std::vector<UnitSpec> units) {
  if (units.empty()) return Status::Invalid("a model must have at least one unit");
  auto e = std::make_unique<ZeroEngine>(c, d, comm, std::move(units));
  ZOE_RETURN_IF_ERROR(e->allocate());
  return std::unique_ptr<Engine>(std::move(e));
}

ZeroEngine::ZeroEngine(const Config& c, Device& d, Comm& comm, std::vector<UnitSpec> units)
    : cfg_(c), dev_(d), comm_(comm), layout_(std::move(units), comm.size()), plan_(StagePlan::for_stage(c.stage)),
      dtype_(c.dtype), wsize_(dtype_size(c.dtype)), gdtype_(c.grad_dtype()), gsize_(dtype_size(gdtype_)),
      scaler_(c.dtype == DType::kF16 && c.static_loss_scale == 0
                  ? LossScaler::dynamic(c.initial_scale_power, c.loss_scale_window, c.hysteresis, c.min_loss_scale)
                  : LossScaler::fixed(c.dtype == DType::kF16 ? c.static_loss_scale : 1.0)) {
  gathered_.resize(layout_.num_units());
  local_seen_.assign(layout_.num_units(), 0);
  reduced_.assign(layout_.num_units(), 0);
}

void ZeroEngine::set_activation_bytes(uint64_t bytes) {
  dev_.ledger().sub(Tier::kDevice, Kind::kActivation, activation_bytes_);
  dev_.ledger().add(Tier::kDevice, Kind::kActivation, bytes);
  activation_bytes_ = bytes;
}

ZeroEngine::~ZeroEngine() {
  set_activation_bytes(0);
  for (auto& g : gathered_) dev_.free(g.buf);
  for (Buffer* b : {&param_, &grad_, &master_, &exp_avg_, &exp_avg_sq_}) dev_.free(*b);
}

Status ZeroEngine::allocate() {
  const int64_t S = layout_.shard_size(), P = layout_.padded_params();
  Tier param_tier = cfg_.offload_param.device == OffloadDevice::kNone ? Tier::kDevice : Tier::kHost;
  Tier opt_tier = cfg_.offload_optimizer.device == OffloadDevice::kNone ? Tier::kDevice : Tier::kHost;
  int64_t opt_elems = plan_.shard_optimizer ? S : P;
  auto make = [&](Buffer& b, int64_t elems, size_t esize, Tier t, Kind k) -> Status {
    ZOE_ASSIGN_OR_RETURN(b, dev_.alloc(elems * esize, t, k));
    return dev_.zero(b.data, b.bytes);  // padding must be zero; also takes the first-touch cost now
  };
  ZOE_RETURN_IF_ERROR(make(param_, plan_.shard_params ? S : P, wsize_, param_tier, Kind::kParam));
  ZOE_RETURN_IF_ERROR(make(grad_, plan_.shard_grads ? S : P, gsize_, Tier::kDevice, Kind::kGrad));
  if (cfg_.mixed_precision()) ZOE_RETURN_IF_ERROR(make(master_, opt_elems, 4, opt_tier, Kind::kMaster));
  ZOE_RETURN_IF_ERROR(make(exp_avg_, opt_elems, 4, opt_tier, Kind::kExpAvg));
  ZOE_RETURN_IF_ERROR(make(exp_avg_sq_, opt_elems, 4, opt_tier, Kind::kExpAvgSq));
  return Status::Ok();
}

int64_t ZeroEngine::param_offset(int u) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_params ? s.shard_offset : s.full_offset;
}
int64_t ZeroEngine::grad_owned_offset(int u) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_grads ? s.shard_offset : s.full_offset + comm_.rank() * s.chunk;
}
int64_t ZeroEngine::opt_offset(int u) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_optimizer ? s.shard_offset : s.full_offset;
}
int64_t ZeroEngine::opt_begin(int u) const {
  return plan_.shard_optimizer ? comm_.rank() * layout_.slot(u).chunk : 0;
}
int64_t ZeroEngine::opt_end(int u) const {
  return plan_.shard_optimizer ? opt_begin(u) + layout_.owned_real(u, comm_.rank()) : layout_.slot(u).numel;
}

Status ZeroEngine::set_params(int u, const float* values) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("unit {} out of range", u));
  const UnitSlot& s = layout_.slot(u);
  // Replicated params hold the whole unit; sharded ones only this rank's chunk.
  int64_t lo = plan_.shard_params ? comm_.rank() * s.chunk : 0;
  int64_t hi = plan_.shard_params ? lo + layout_.owned_real(u, comm_.rank()) : s.numel;
  // The host values this rank keeps go to device memory first (only those: a sharded rank
  // stages one chunk); the device converts them to the weight dtype.
  // A rank whose chunk is all padding holds nothing of this unit: lo == hi past the end.
  int64_t a = std::min({lo, opt_begin(u), s.numel}), b = std::min(std::max(hi, opt_end(u)), s.numel);
  if (b <= a) return Status::Ok();
  ZOE_ASSIGN_OR_RETURN(Buffer staging, dev_.alloc((b - a) * 4, Tier::kDevice, Kind::kStaging));
  Status st = dev_.upload(staging.data, values + a, (b - a) * 4);
  const float* v = staging.as<float>();  // v[i] holds unit element a + i
  if (st.ok() && hi > lo)
    st = dev_.accumulate(param_ptr(param_offset(u)), dtype_, v + (lo - a), DType::kF32, hi - lo, false);
  if (st.ok() && cfg_.mixed_precision() && opt_end(u) > opt_begin(u))
    st = dev_.accumulate(master_.as<float>() + opt_offset(u), DType::kF32, v + (opt_begin(u) - a), DType::kF32,
                         opt_end(u) - opt_begin(u), false);
  dev_.free(staging);
  return st;
}

Result<ParamView> ZeroEngine::fetch(int u) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("fetch: unit {} out of range", u));
  const UnitSlot& s = layout_.slot(u);
  if (!plan_.shard_params) return ParamView{param_ptr(s.full_offset), dtype_, s.numel};
  Gathered& g = gathered_[u];
  if (g.refs > 0) {  // nested: already gathered
    ++g.refs;
    return ParamView{g.buf.data, dtype_, s.numel};
  }
  ZOE_RETURN_IF_ERROR(sync_point(OpKind::kFetch, u, nullptr));
  ZOE_ASSIGN_OR_RETURN(Buffer buf, dev_.alloc(s.full_size * wsize_, Tier::kDevice, Kind::kGather));
  // Our chunk moves from its home tier into our slot, then the slots are filled in place.
  size_t chunk_bytes = s.chunk * wsize_;
  Status st = dev_.copy_async(buf, comm_.rank() * chunk_bytes, param_, s.shard_offset * wsize_, chunk_bytes,
                              Stream::kH2D);
  if (st.ok()) st = dev_.wait(dev_.record(Stream::kH2D));
  if (st.ok()) {
    ZOE_SPAN("all_gather " + unit(u).name, "all_gather", Bucket::kWaitComm);
    st = comm_.all_gather(buf.as<char>() + comm_.rank() * chunk_bytes, buf.data, chunk_bytes);
  }
  if (!st.ok()) {  // counted only once it is really there
    dev_.free(buf);
    return st;
  }
  g.buf = buf;
  g.refs = 1;
  return ParamView{g.buf.data, dtype_, s.numel};
}

Status ZeroEngine::release(int u) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("release: unit {} out of range", u));
  if (!plan_.shard_params) return Status::Ok();
  Gathered& g = gathered_[u];
  if (g.refs == 0) return Status::Runtime(fmt::format("release of unit '{}' that is not fetched", unit(u).name));
  if (--g.refs == 0) dev_.free(g.buf);
  return Status::Ok();
}

Status ZeroEngine::reduce_unit_grad(int u, const void* full_grad) {
  const UnitSlot& s = layout_.slot(u);
  ZOE_SPAN("reduce_scatter " + unit(u).name, "reduce_scatter", Bucket::kWaitComm);
  return comm_.reduce_scatter(full_grad, grad_ptr(grad_owned_offset(u)), s.chunk, gdtype_);
}

Status ZeroEngine::grads_ready(int u, const float* grad) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("grads_ready: unit {} out of range", u));
  if (grad == nullptr) return Status::Invalid(fmt::format("grads_ready: null gradient for unit '{}'", unit(u).name));
  const UnitSlot& s = layout_.slot(u);
  if (!plan_.shard_grads) {  // accumulate locally; reduced once in step()
    ZOE_RETURN_IF_ERROR(
        dev_.accumulate(grad_ptr(s.full_offset), gdtype_, grad, DType::kF32, s.numel, local_seen_[u] > 0));
    ++local_seen_[u];  // only once the gradient is really in
    return Status::Ok();
  }
  return sync_point(OpKind::kGrads, u, grad);
}

Status ZeroEngine::sync_point(OpKind kind, int u, const float* grad) {
  if (comm_.size() == 1) return kind == OpKind::kGrads ? reduce_sharded_grad(u, grad) : Status::Ok();
  const int n = comm_.size();
  int32_t mine[2] = {static_cast<int32_t>(kind), u};
  std::vector<int32_t> all(2 * n);
  for (;;) {
    ZOE_RETURN_IF_ERROR(comm_.all_gather_control(mine, all.data(), sizeof(mine)));
    bool same = true;
    for (int r = 1; r < n; ++r) same &= all[2 * r] == all[0] && all[2 * r + 1] == all[1];
    if (same) return kind == OpKind::kGrads ? reduce_sharded_grad(u, grad) : Status::Ok();
    // Ranks differ. Gradients handed over anywhere are reduced now, in unit order, with zeros
    // from the ranks that have none for that unit; those ranks' calls are then done.
    std::vector<int> units;
    for (int r = 0; r < n; ++r)
      if (all[2 * r] == static_cast<int32_t>(OpKind::kGrads)) units.push_back(all[2 * r + 1]);
    if (units.empty()) {
      auto what = [&](int r) {
        auto k = static_cast<OpKind>(all[2 * r]);
        int v = all[2 * r + 1];
        return k == OpKind::kStep ? std::string("step()")
                                  : fmt::format("{}('{}')", k == OpKind::kFetch ? "fetch" : "grads_ready",
                                                v >= 0 && v < num_units() ? unit(v).name : "?");
      };
      int other = 1;
      while (other < n && all[2 * other] == all[0] && all[2 * other + 1] == all[1]) ++other;
      return Status::Runtime(fmt::format("ranks are out of step: rank 0 calls {} while rank {} calls {} (every rank "
                                         "must fetch the same units in the same order)", what(0), other, what(other)));
    }
    std::sort(units.begin(), units.end());
    units.erase(std::unique(units.begin(), units.end()), units.end());
    bool mine_done = false;
    for (int v : units) {
      if (v < 0 || v >= num_units()) return Status::Runtime(fmt::format("a rank handed over gradients of unit {}", v));
      bool have = kind == OpKind::kGrads && v == u;
      ZOE_RETURN_IF_ERROR(reduce_sharded_grad(v, have ? grad : nullptr));
      mine_done |= have;
    }
    if (mine_done) return Status::Ok();
  }
}

// Sharded gradients: this micro-step's gradient of unit u (zeros when grad is null) is reduced
// now; only our chunk is kept, summed into what earlier reductions this step left there.
Status ZeroEngine::reduce_sharded_grad(int u, const float* grad) {
  const UnitSlot& s = layout_.slot(u);
  bool first = reduced_[u] == 0;
  ZOE_ASSIGN_OR_RETURN(Buffer buf, dev_.alloc(s.full_size * gsize_, Tier::kDevice, Kind::kComm));
  Status st = grad ? dev_.accumulate(buf.data, gdtype_, grad, DType::kF32, s.numel, false)
                   : dev_.zero(buf.data, s.numel * gsize_);
  if (st.ok()) st = dev_.zero(buf.as<char>() + s.numel * gsize_, (s.full_size - s.numel) * gsize_);
  char* own = buf.as<char>() + comm_.rank() * s.chunk * gsize_;
  {
    ZOE_SPAN("reduce_scatter " + unit(u).name, "reduce_scatter", Bucket::kWaitComm);
    if (st.ok()) st = comm_.reduce_scatter(buf.data, first ? grad_ptr(grad_owned_offset(u)) : own, s.chunk, gdtype_);
  }
  if (st.ok() && !first) st = dev_.accumulate(grad_ptr(grad_owned_offset(u)), gdtype_, own, gdtype_, s.chunk, true);
  dev_.free(buf);
  if (st.ok()) ++reduced_[u];
  return st;
}

Result<double> ZeroEngine::owned_grad_sumsq() {
  double local = 0;
  for (int u = 0; u < num_units(); ++u) {
    ZOE_ASSIGN_OR_RETURN(double s, dev_.sum_squares(grad_ptr(grad_owned_offset(u)), gdtype_,
                                                    layout_.owned_real(u, comm_.rank())));
    local += s;
  }
  ZOE_RETURN_IF_ERROR(comm_.all_reduce_sum(&local, 1));
  return local;
}

Status ZeroEngine::apply_adam(double lr, double grad_scale, uint64_t* nonfinite) {
  AdamHyper h;
  h.lr = lr;
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.decoupled = cfg_.adamw;
  h.step = steps_applied_;
  h.grad_scale = static_cast<float>(grad_scale);
  ZOE_SPAN("adam", "adam", Bucket::kOptimizer);
  for (int u = 0; u < num_units(); ++u) {
    const UnitSlot& s = layout_.slot(u);
    int64_t lo = opt_begin(u), hi = opt_end(u);
    // The range's gradient, weights and state, each at its position for element `lo`.
    char* g = plan_.shard_optimizer ? grad_ptr(grad_owned_offset(u)) : grad_ptr(s.full_offset);
    char* w = plan_.shard_params ? param_ptr(s.shard_offset) : param_ptr(s.full_offset + lo);
    float* m = exp_avg_.as<float>() + opt_offset(u);
    float* v = exp_avg_sq_.as<float>() + opt_offset(u);
    float* master = cfg_.mixed_precision() ? master_.as<float>() + opt_offset(u) : reinterpret_cast<float*>(w);
    for (const Segment& seg : layout_.segments(u, lo, hi)) {
      h.weight_decay = seg.decay ? cfg_.weight_decay : 0.0;
      AdamRange r;
      r.grad = g + seg.begin * gsize_;
      r.grad_dtype = gdtype_;
      r.master = master + seg.begin;
      r.exp_avg = m + seg.begin;
      r.exp_avg_sq = v + seg.begin;
      r.param_out = cfg_.mixed_precision() ? w + seg.begin * wsize_ : nullptr;
      r.param_dtype = dtype_;
      r.n = seg.end - seg.begin;
      ZOE_ASSIGN_OR_RETURN(size_t bad, dev_.adam(h, r));
      *nonfinite += bad;
    }
  }
  return Status::Ok();
}

Status ZeroEngine::gather_replicated_params() {
  if (!plan_.shard_optimizer || plan_.shard_params) return Status::Ok();
  ZOE_SPAN("all_gather params", "all_gather", Bucket::kWaitComm);
  for (int u = 0; u < num_units(); ++u) {
    const UnitSlot& s = layout_.slot(u);
    ZOE_RETURN_IF_ERROR(comm_.all_gather(param_ptr(s.full_offset + comm_.rank() * s.chunk),
                                         param_ptr(s.full_offset), s.chunk * wsize_));
  }
  return Status::Ok();
}

Result<StepResult> ZeroEngine::step(double lr) {
  StepResult res;
  res.loss_scale = scaler_.scale();
  res.lr = lr;
  // Serves gradients other ranks still hand over, then every rank is at this step.
  if (plan_.shard_grads) ZOE_RETURN_IF_ERROR(sync_point(OpKind::kStep, -1, nullptr));
  for (int u = 0; u < num_units(); ++u) {
    const UnitSlot& s = layout_.slot(u);
    int seen = plan_.shard_grads ? reduced_[u] : local_seen_[u];
    if (seen == 0)  // a unit without gradient this step contributes zeros
      ZOE_RETURN_IF_ERROR(dev_.zero(grad_ptr(plan_.shard_grads ? s.shard_offset : s.full_offset),
                                    (plan_.shard_grads ? s.chunk : s.full_size) * gsize_));
    if (!plan_.shard_grads) ZOE_RETURN_IF_ERROR(reduce_unit_grad(u, grad_ptr(s.full_offset)));
  }
  std::fill(local_seen_.begin(), local_seen_.end(), 0);
  std::fill(reduced_.begin(), reduced_.end(), 0);
  double sumsq = 0;
  {
    ZOE_SPAN("grad_norm", "compute", Bucket::kOptimizer);
    ZOE_ASSIGN_OR_RETURN(sumsq, owned_grad_sumsq());
  }
  // Gradients are sums over ranks and micro-steps of loss-scaled gradients: average and unscale.
  double inv = 1.0 / (res.loss_scale * comm_.size() * cfg_.grad_accum);
  bool overflow = !std::isfinite(sumsq);
  scaler_.update(overflow);
  res.step = steps_applied_;
  if (overflow) {
    res.grad_norm = sumsq;
    return res;
  }
  res.grad_norm = std::sqrt(sumsq) * inv;
  double coef = 1.0;
  if (cfg_.grad_clip > 0 && res.grad_norm > cfg_.grad_clip) coef = cfg_.grad_clip / (res.grad_norm + 1e-6);
  if (!plan_.shard_optimizer) {  // the second half of the all-reduce: everyone needs every gradient
    ZOE_SPAN("all_gather grads", "all_gather", Bucket::kWaitComm);
    for (int u = 0; u < num_units(); ++u) {
      const UnitSlot& s = layout_.slot(u);
      ZOE_RETURN_IF_ERROR(comm_.all_gather(grad_ptr(grad_owned_offset(u)), grad_ptr(s.full_offset), s.chunk * gsize_));
    }
  }
  ++steps_applied_;
  ZOE_RETURN_IF_ERROR(apply_adam(lr, inv * coef, &res.nonfinite));
  ZOE_RETURN_IF_ERROR(gather_replicated_params());
  res.applied = true;
  res.step = steps_applied_;
  return res;
}

OwnedState ZeroEngine::owned_state(int u) {
  OwnedState o;
  o.begin = opt_begin(u);
  o.end = opt_end(u);
  const UnitSlot& s = layout_.slot(u);
  char* w = plan_.shard_params ? param_ptr(s.shard_offset) : param_ptr(s.full_offset + o.begin);
  o.master = cfg_.mixed_precision() ? master_.as<float>() + opt_offset(u) : reinterpret_cast<float*>(w);
  o.exp_avg = exp_avg_.as<float>() + opt_offset(u);
  o.exp_avg_sq = exp_avg_sq_.as<float>() + opt_offset(u);
  return o;
}

Status ZeroEngine::commit_owned_state() {
  if (cfg_.mixed_precision()) {
    for (int u = 0; u < num_units(); ++u) {
      OwnedState o = owned_state(u);
      const UnitSlot& s = layout_.slot(u);
      char* w = plan_.shard_params ? param_ptr(s.shard_offset) : param_ptr(s.full_offset + o.begin);
      ZOE_RETURN_IF_ERROR(dev_.accumulate(w, dtype_, o.master, DType::kF32, o.end - o.begin, false));
    }
  }
  return gather_replicated_params();
}

void ZeroEngine::restore_counters(int64_t steps, double scale, int64_t good, int hyst) {
  steps_applied_ = steps;
  scaler_.restore(scale, good, hyst);
}

void ZeroEngine::scaler_state(int64_t* good, int* hyst) const {
  *good = scaler_.good_steps();
  *hyst = scaler_.hysteresis_left();
}

}  // namespace zoe

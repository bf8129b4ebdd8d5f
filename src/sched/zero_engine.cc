#include "sched/zero_engine.h"

#include "sched/memory_estimate.h"
#include "nvme/io_error.h"

#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "common/profiler.h"
#include "kernels/adam.h"

namespace zoe {

namespace {

// What the prefetcher weighs units by: their gathered elements.
std::vector<int64_t> unit_elems(const ShardLayout& l) {
  std::vector<int64_t> v;
  for (int u = 0; u < l.num_units(); ++u) v.push_back(l.slot(u).full_size);
  return v;
}

// ZOE_POISON_RELEASED=1: released gather buffers are filled with NaN (see GatherPool).
bool poison_released() {
  const char* v = std::getenv("ZOE_POISON_RELEASED");
  return v && *v && std::string(v) != "0";
}

}  // namespace

Result<std::unique_ptr<ZeroEngine>> ZeroEngine::create(const EngineOptions& c, Device& d, Comm& comm, std::vector<UnitSpec> units,
                                               NvmeEnv* nvme_env) {
  if (units.empty()) return Status::Invalid("a model must have at least one unit");
  auto e = std::make_unique<ZeroEngine>(c, d, comm, std::move(units), nvme_env);
  ZOE_RETURN_IF_ERROR(e->allocate());
  return e;
}

ZeroEngine::ZeroEngine(const EngineOptions& c, Device& d, Comm& comm, std::vector<UnitSpec> units, NvmeEnv* nvme_env)
    : cfg_(c), dev_(d), comm_(comm), layout_(std::move(units), comm.size()), plan_(StagePlan::for_stage(c.stage)),
      dtype_(c.dtype), wsize_(dtype_size(c.dtype)), gdtype_(c.grad_dtype), gsize_(dtype_size(gdtype_)),
      scaler_(c.dtype == DType::kF16 && c.static_loss_scale == 0
                  ? LossScaler::dynamic(c.initial_scale_power, c.loss_scale_window, c.hysteresis, c.min_loss_scale)
                  : LossScaler::fixed(c.dtype == DType::kF16 ? c.static_loss_scale : 1.0)),
      state_(cfg_, d, layout_, plan_, comm.rank(), nvme_env), pass_(state_, d), agreement_(comm, layout_),
      reducer_(state_, pass_, agreement_, d, comm), mover_(state_, pass_, agreement_, reducer_, comm),
      units_(d, mover_, unit_elems(layout_), wsize_,
             PrefetchLimits{c.prefetch_bucket_size, c.max_live_parameters, c.max_reuse_distance},
             c.device_memory_budget, poison_released()) {}

void ZeroEngine::set_activation_bytes(uint64_t bytes) {
  dev_.ledger().sub(Tier::kDevice, Kind::kActivation, activation_bytes_);
  dev_.ledger().add(Tier::kDevice, Kind::kActivation, bytes);
  activation_bytes_ = bytes;
}

// The optimizer's pass (and a report of its error, if no call returned it) and the state go with
// their members, after the gathers and reductions that use the device here.
ZeroEngine::~ZeroEngine() {
  (void)reducer_.finish();
  units_.clear();  // waits for its gathers on the communication thread, which goes next
  reducer_.set_worker(nullptr);
  mover_.set_worker(nullptr);
  comm_worker_.reset();
  set_activation_bytes(0);
  comm_.set_device(nullptr);
}

ZeroEngine::SchedStats ZeroEngine::sched_stats() const {
  SchedStats s;
  static_cast<UnitScheduler::Stats&>(s) = units_.stats();
  s.adam_hashed_blocks = pass_.hashed_blocks();
  s.units_updated_in_backward = pass_.opened_in_backward();
  s.updates_taken_back = taken_back_;
  s.reductions_async = reducer_.async_reductions();
  s.norm_shares_at_hand_over = reducer_.units_summed_at_hand_over();
  NvmeStore::Traffic t = state_.nvme_traffic();
  s.nvme_read_bytes = t.read_bytes;
  s.nvme_written_bytes = t.written_bytes;
  s.nvme_hashed_bytes = t.hashed_bytes;
  s.nvme_forwarded_bytes = t.forwarded_bytes;
  return s;
}

Status ZeroEngine::allocate() {
  comm_.set_device(&dev_);
  ZOE_RETURN_IF_ERROR(reducer_.allocate());
  reducer_.set_make_room([this] { return units_.drop_idle(); });
  // Swap directories are named after rank 0's pid and random bits: jobs started from the same
  // directory, or in two containers whose pids coincide, get their own, and a dead job's are
  // recognised (unlocked) and removed by the next one.
  std::string job;
  if (cfg_.offload_optimizer.device == OffloadDevice::kNvme || cfg_.offload_param.device == OffloadDevice::kNvme) {
    std::array<int64_t, 2> id = {getpid(), swap_job_tag()};
    ZOE_RETURN_IF_ERROR(comm_.broadcast(id.data(), sizeof(id), 0));
    job = swap_job_name(id[0], static_cast<uint32_t>(id[1]));
  }
  ZOE_RETURN_IF_ERROR(check_state_fits());
  ZOE_RETURN_IF_ERROR(state_.allocate(job));
  ZOE_RETURN_IF_ERROR(pass_.allocate());
  ZOE_RETURN_IF_ERROR(reserve_staging(comm_));
  ZOE_RETURN_IF_ERROR(check_device_fits());
  return start_comm_worker();
}

// The communicator that reduces holds its staging from the start (booked before the reserve is
// sized): grown by the first reduction instead, on the communication thread, it would take the
// room the reserve keeps for the model's gradient in the middle of the first step.
Status ZeroEngine::reserve_staging(Comm& c) {
  int64_t chunk = 0;
  for (int u = 0; u < num_units(); ++u) chunk = std::max(chunk, layout_.slot(u).chunk);
  return c.reserve_staging(static_cast<size_t>(chunk), gdtype_)
      .prefixed(fmt::format("the communicator's staging for the largest gradient reduction ({} elements a rank): ", chunk));
}

// Sharded gradients are reduced on a communication thread of their own when the transport lets
// two threads run collectives (else, and without overlap_comm, at the hand-over) and the device
// has room for one more reduction buffer beside a unit in flight.
Status ZeroEngine::start_comm_worker() {
  if (!cfg_.overlap_comm || !plan_.shard_grads) return Status::Ok();
  int64_t largest = 0;
  for (int u = 0; u < num_units(); ++u) largest = std::max(largest, layout_.slot(u).full_size);
  const uint64_t extra = comm_thread_bytes(largest, gsize_);
  // Duplicating is collective: all ranks do, or none.
  uint8_t fits = units_.reserve() + extra <= units_.device_free();
  std::vector<uint8_t> all(comm_.size());
  ZOE_RETURN_IF_ERROR(comm_.all_gather_control(&fits, all.data(), 1));
  if (std::count(all.begin(), all.end(), 1) != comm_.size()) return Status::Ok();
  auto dup = comm_.duplicate();
  if (!dup.ok()) return dup.status().code() == Code::kUnsupported ? Status::Ok() : dup.status();
  // The duplicate reduces from now on: the staging moves to it (given back first, so the device
  // never holds both).
  ZOE_RETURN_IF_ERROR(comm_.reserve_staging(0, gdtype_));
  ZOE_RETURN_IF_ERROR(reserve_staging(**dup));
  comm_worker_ = std::make_unique<CommWorker>(std::move(*dup), dev_);
  reducer_.set_worker(comm_worker_.get());
  mover_.set_worker(comm_worker_.get());
  units_.set_reserve(units_.reserve() + extra);
  return Status::Ok();
}

namespace {

// The state a configuration puts in tier t per rank (the ledger's exact bytes).
uint64_t state_in(Tier t, const ShardLayout& l, int stage, DType dtype, OffloadDevice opt, OffloadDevice par) {
  const StageMemory m = exact_stage(l.padded_params(), l.shard_size(), stage, dtype, opt, par);
  return static_cast<uint64_t>(m.by_tier[static_cast<int>(t)]);
}

// What a configuration keeps on the device per rank: the state there and the largest unit in flight.
struct DeviceNeed {
  uint64_t state = 0, in_flight = 0;
  int largest = 0;  // the unit
  uint64_t total() const { return state + in_flight; }
};
DeviceNeed device_need(const ShardLayout& l, int stage, DType dtype, OffloadDevice opt, OffloadDevice par,
                       size_t wsize, size_t gsize) {
  DeviceNeed d;
  d.state = state_in(Tier::kDevice, l, stage, dtype, opt, par);
  for (int u = 0; u < l.num_units(); ++u) {
    const uint64_t n = unit_in_flight_bytes(l.slot(u).full_size, stage, wsize, gsize);
    if (n > d.in_flight) d.in_flight = n, d.largest = u;
  }
  return d;
}

// "N ranks (needs B)" for the fewest ranks above `now` (up to 4096) at which need(layout) fits
// `left`, or "" if none does.
template <class Need>
std::string fewest_ranks(const ShardLayout& l, int now, uint64_t left, Need need) {
  std::vector<UnitSpec> units;
  for (int u = 0; u < l.num_units(); ++u) units.push_back(l.unit(u));
  for (int n = now + 1; n <= 4096; n = n < 64 ? n + 1 : n * 2) {
    const uint64_t b = need(ShardLayout(units, n));
    if (b <= left) return fmt::format("{} ranks (needs {})", n, bytes_text(b));
  }
  return "";
}

// "a, or b, or c" of the ways that are not empty.
std::string either(const std::vector<std::string>& ways) {
  std::string text;
  for (const std::string& w : ways)
    if (!w.empty()) text += (text.empty() ? "" : ", or ") + w;
  return text;
}

}  // namespace

uint64_t ZeroEngine::unit_device_need(int u) const {
  return unit_in_flight_bytes(layout_.slot(u).full_size, cfg_.stage, wsize_, gsize_);
}

// The single changes that would make a job fit `left` bytes of the device, each with what it
// would need there: a larger budget, stage 3, the optimizer (or, at stage 3, the parameters) in
// host memory where the host budget holds that state, or more ranks.
std::string ZeroEngine::ways_to_fit(uint64_t need, uint64_t left) const {
  const auto opt = cfg_.offload_optimizer.device, par = cfg_.offload_param.device;
  const int stage = cfg_.stage;
  const uint64_t held = cfg_.device_memory_budget > left ? cfg_.device_memory_budget - left : 0;  // before the state
  std::vector<std::string> ways = {fmt::format("zoe.device_memory_budget {} or more", bytes_text(held + need))};
  auto host_holds = [&](int st, OffloadDevice o, OffloadDevice p) {
    return cfg_.host_memory_budget == 0 || state_in(Tier::kHost, layout_, st, dtype_, o, p) <= cfg_.host_memory_budget;
  };
  auto offer = [&](const DeviceNeed& d, const std::string& change) {
    if (d.total() <= left) ways.push_back(fmt::format("{} (needs {})", change, bytes_text(d.total())));
  };
  if (stage < 3) offer(device_need(layout_, 3, dtype_, opt, par, wsize_, gsize_), "zero_optimization.stage 3");
  if (opt == OffloadDevice::kNone && host_holds(stage, OffloadDevice::kCpu, par))
    offer(device_need(layout_, stage, dtype_, OffloadDevice::kCpu, par, wsize_, gsize_),
          "zero_optimization.offload_optimizer.device \"cpu\"");
  if (stage == 3 && par == OffloadDevice::kNone && host_holds(stage, opt, OffloadDevice::kCpu))
    offer(device_need(layout_, stage, dtype_, opt, OffloadDevice::kCpu, wsize_, gsize_),
          "zero_optimization.offload_param.device \"cpu\"");
  if (stage >= 1)  // more ranks shard it smaller
    ways.push_back(fewest_ranks(layout_, comm_.size(), left, [&](const ShardLayout& l) {
      return device_need(l, stage, dtype_, opt, par, wsize_, gsize_).total();
    }));
  return either(ways);
}

// Before the state is allocated: what the state certainly keeps on the device (the seed's table,
// a lower bound: a partial offload ratio only lowers it further) and the largest unit in flight
// must fit the budget, or the job is a bad config, refused naming the key, the need and the room.
Status ZeroEngine::check_state_fits() {
  ZOE_RETURN_IF_ERROR(check_host_fits());
  const DeviceNeed d = device_need(layout_, cfg_.stage, dtype_, cfg_.offload_optimizer.device,
                                   cfg_.offload_param.device, wsize_, gsize_);
  const uint64_t left = units_.device_free();
  if (d.total() <= left) return Status::Ok();
  return Status::Invalid(fmt::format(
      "config key 'zoe.device_memory_budget' ({}): too small for this model: its state on the device needs {} and "
      "unit '{}' in flight {} more ({} in all), and {} of the budget is free; it would fit with {}",
      bytes_text(cfg_.device_memory_budget), bytes_text(d.state), unit(d.largest).name, bytes_text(d.in_flight),
      bytes_text(d.total()), bytes_text(left), ways_to_fit(d.total(), left)));
}

// The same for host memory: the state the config puts there (an offloaded optimizer, the sharded
// gradients beside it, offloaded parameters) against the whole host budget, a lower bound (the
// NVMe tier's pinned pool and the buffers come on top, checked as they are allocated). Refused naming the budget that would hold it and
// the single changes that would (the state on NVMe instead, the fewest ranks).
Status ZeroEngine::check_host_fits() {
  const auto opt = cfg_.offload_optimizer.device, par = cfg_.offload_param.device;
  auto host_need = [&](const ShardLayout& l, OffloadDevice o, OffloadDevice p) {
    return state_in(Tier::kHost, l, cfg_.stage, dtype_, o, p);
  };
  const uint64_t need = host_need(layout_, opt, par), left = cfg_.host_memory_budget;
  if (left == 0 || need <= left) return Status::Ok();
  std::vector<std::string> ways = {fmt::format("zoe.host_memory_budget {} or more", bytes_text(need))};
  auto offer = [&](uint64_t n, const std::string& change) {
    if (n <= left) ways.push_back(fmt::format("{} (needs {})", change, bytes_text(n)));
  };
  if (opt == OffloadDevice::kCpu)
    offer(host_need(layout_, OffloadDevice::kNvme, par), "zero_optimization.offload_optimizer.device \"nvme\"");
  if (par == OffloadDevice::kCpu)
    offer(host_need(layout_, opt, OffloadDevice::kNvme), "zero_optimization.offload_param.device \"nvme\"");
  if (cfg_.stage >= 1)
    ways.push_back(fewest_ranks(layout_, comm_.size(), left, [&](const ShardLayout& l) { return host_need(l, opt, par); }));
  return Status::Invalid(fmt::format(
      "config key 'zoe.host_memory_budget' ({}): too small for this model: the state it puts in host memory "
      "needs {}; it would fit with {}",
      bytes_text(left), bytes_text(need), either(ways)));
}

// A unit that cannot be in flight next to the persistent state is an error now, not an
// out-of-memory error in the middle of a step.
Status ZeroEngine::check_device_fits() {
  uint64_t budget = cfg_.device_memory_budget, left = units_.device_free(), reserve = 0;
  for (int u = 0; u < num_units(); ++u) {
    uint64_t need = unit_device_need(u);
    reserve = std::max(reserve, need);
    if (need > left)
      return Status::Invalid(fmt::format(
          "unit '{}' needs {} bytes on the device at once (its gathered weights, its fp32 gradient and its "
          "reduction buffer), but zoe.device_memory_budget ({} bytes) leaves {} after the persistent state, "
          "the communicator's staging and the compute ops' workspace ({} bytes): raise the budget or offload the state (offload_param, "
          "offload_optimizer)",
          unit(u).name, need, budget, left, budget - left));
  }
  units_.set_reserve(reserve);
  return Status::Ok();
}

// Where owned elements [begin, end) of unit u's kind k are: in fp32 training the master is the
// parameter array itself, in the weight dtype and at parameter positions.
Result<ZeroEngine::OwnedPlace> ZeroEngine::owned_place(const char* op, int u, OwnedKind k, int64_t begin,
                                                       int64_t end) {
  if (u < 0 || u >= num_units() || begin < state_.opt_begin(u) || end > state_.opt_end(u) || begin > end)
    return Status::Invalid(fmt::format("{}: [{}, {}) is not owned in unit {}", op, begin, end, u));
  if (k == OwnedKind::kMaster && !cfg_.mixed_precision()) return OwnedPlace{&state_.param(), dtype_, state_.param_index(u, begin)};
  return OwnedPlace{&state_.owned_array(k), DType::kF32, state_.opt_index(u, begin)};
}

Status ZeroEngine::read_owned(int u, OwnedKind k, int64_t begin, int64_t end, float* dst) {
  ZOE_RETURN_IF_ERROR(wait_update());
  ZOE_ASSIGN_OR_RETURN(OwnedPlace p, owned_place("read_owned", u, k, begin, end));
  return state_.get_f32(*p.array, p.dtype, p.index, end - begin, dst);
}

Status ZeroEngine::write_owned(int u, OwnedKind k, int64_t begin, int64_t end, const float* src) {
  ZOE_RETURN_IF_ERROR(wait_update());
  pass_.drop_read_ahead();
  ZOE_RETURN_IF_ERROR(unload_all());
  ZOE_ASSIGN_OR_RETURN(OwnedPlace p, owned_place("write_owned", u, k, begin, end));
  return state_.put_f32(*p.array, p.dtype, p.index, end - begin, src);
}

Status ZeroEngine::set_params(int u, const float* values) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("unit {} out of range", u));
  ZOE_RETURN_IF_ERROR(wait_update());
  pass_.drop_read_ahead();
  ZOE_RETURN_IF_ERROR(unload_all());
  const UnitSlot& s = layout_.slot(u);
  // Replicated params hold the whole unit; sharded ones only this rank's chunk (none of it when
  // the chunk is all padding).
  int64_t lo = plan_.shard_params ? std::min(comm_.rank() * s.chunk, s.numel) : 0;
  int64_t hi = plan_.shard_params ? lo + layout_.owned_real(u, comm_.rank()) : s.numel;
  if (hi > lo)
    ZOE_RETURN_IF_ERROR(state_.put_f32(state_.param(), dtype_, state_.param_index(u, lo), hi - lo, values + lo));
  const int64_t a = state_.opt_begin(u), b = state_.opt_end(u);
  if (cfg_.mixed_precision() && b > a)
    ZOE_RETURN_IF_ERROR(state_.put_f32(state_.master(), DType::kF32, state_.opt_index(u, a), b - a, values + a));
  return Status::Ok();
}

Result<ParamView> ZeroEngine::fetch(int u) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("fetch: unit {} out of range", u));
  const UnitSlot& s = layout_.slot(u);
  if (!plan_.shard_params) return ParamView{state_.param().ptr(s.full_offset), dtype_, s.numel};
  Result<UnitScheduler::Fetched> got = units_.fetch(u);
  if (!got.ok() && got.status().code() == Code::kOutOfMemory)
    return got.status().prefixed(fmt::format("fetch of unit '{}' ({} bytes gathered): ", unit(u).name,
                                             s.full_size * wsize_));
  ZOE_ASSIGN_OR_RETURN(UnitScheduler::Fetched f, std::move(got));
  if (f.left_plan && !told_deviation_ && comm_.rank() == 0) {
    told_deviation_ = true;
    std::fprintf(stderr, "zoe: warning: a step fetched unit '%s' out of the recorded order: prefetching stops for "
                 "this step and follows the new order from the next one\n", unit(u).name.c_str());
  }
  return ParamView{f.data, dtype_, s.numel};
}

Status ZeroEngine::release(int u) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("release: unit {} out of range", u));
  if (!plan_.shard_params) return Status::Ok();
  if (!units_.fetched(u)) return Status::Runtime(fmt::format("release of unit '{}' that is not fetched", unit(u).name));
  return units_.release(u);
}

Status ZeroEngine::unload_all() { return plan_.shard_params ? units_.unload_all() : Status::Ok(); }

Status ZeroEngine::grads_ready(int u, const float* grad) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("grads_ready: unit {} out of range", u));
  if (grad == nullptr) return Status::Invalid(fmt::format("grads_ready: null gradient for unit '{}'", unit(u).name));
  // An announced update starts at the backward's first hand-over, not before the forward: its
  // windows would wait in the pinned pool for what the forward's loads hold.
  if (early_lr_ && speculating_ && !pass_.in_backward())
    start_update(*early_lr_, mean_unscaled(), steps_applied_ + 1, true);
  return reducer_.hand_over(u, grad);
}

Status ZeroEngine::gather_replicated_params() {
  if (!plan_.shard_optimizer || plan_.shard_params) return Status::Ok();
  ZOE_SPAN("all_gather params", "all_gather", Bucket::kWaitComm);
  for (int u = 0; u < num_units(); ++u) {
    const UnitSlot& s = layout_.slot(u);
    ZOE_RETURN_IF_ERROR(comm_.all_gather(state_.param().ptr(s.full_offset + comm_.rank() * s.chunk),
                                         state_.param().ptr(s.full_offset), s.chunk * wsize_));
  }
  return Status::Ok();
}

// Gathered and loading units hold the parameters as they were: gone before the update. The
// next step's first units start loading as soon as it is done.
Result<StepResult> ZeroEngine::step(double lr) {
  const bool early = early_lr_.has_value() && pass_.in_backward();  // announced, and a gradient came
  const double announced = early ? *early_lr_ : lr;
  early_lr_.reset();
  Result<StepResult> res = StepResult{};
  if (early && announced != lr) {
    pass_.cancel();
    (void)reducer_.finish();
    reducer_.drop();
    res = Status::Invalid(fmt::format("step({}): update_during_backward() announced lr {} and the update began with "
                                      "it; the step is not applied (units already stepped stay so)", lr, announced));
  } else {
    if (!early) ZOE_RETURN_IF_ERROR(wait_update());
    Status st = unload_all();
    res = st.ok() ? apply_step(lr, early) : Result<StepResult>(st);
    // An update begun in the backward that this step does not release ends here, unfinished.
    if (early && !res.ok() && pass_.in_backward()) pass_.cancel();
  }
  units_.begin_step();
  if (res.ok() && plan_.shard_params) units_.prefetch();
  return res;
}

// zoe.update_in_backward: the pass starts at the next hand-over, gated; each unit's gate opens
// when its owned gradient is final (GradReducer), the rest at step(). Adam needs nothing global
// but the gradient's scale: the pass assumes the unclipped, finite step (SuperOffload's
// speculation), which step() confirms from the global norm or takes back. It speculates only
// while that pays: after a step the norm clipped or skipped, the next one's update waits for its
// norm (one more pass over the state a step would cost each time it were taken back).
Status ZeroEngine::update_during_backward(double lr) {
  if (!cfg_.update_in_backward) return Status::Ok();
  if (early_lr_) return Status::Invalid("update_during_backward: called twice before step()");
  speculating_ = speculate_next_;
  if (!speculating_) {
    early_lr_ = lr;  // announced: step() sees it, the update runs after the backward
    return Status::Ok();
  }
  {
    ZOE_SPAN("wait update", "adam", Bucket::kOptimizer);
    ZOE_RETURN_IF_ERROR(wait_update());  // the last step's
  }
  ZOE_RETURN_IF_ERROR(pass_.reset_counts());
  // The pass will wait for the backward's gradients, so it must not wait for pinned memory the
  // backward's loads hold: its windows are taken now, with nothing loading (unload_all).
  ZOE_RETURN_IF_ERROR(unload_all());
  ZOE_RETURN_IF_ERROR(pass_.reserve_windows());
  early_lr_ = lr;  // the pass starts at the first grads_ready
  return Status::Ok();
}

// early: the update began in the backward (update_during_backward); it is released here instead
// of started, and anything that would skip or scale it is an error (some units are stepped).
Result<StepResult> ZeroEngine::apply_step(double lr, bool early) {
  StepResult res;
  res.loss_scale = scaler_.scale();
  res.lr = lr;
  // Serves gradients other ranks still hand over, then every rank is at this step.
  if (plan_.shard_grads) ZOE_RETURN_IF_ERROR(agreement_.agree(Agreement::Call::kStep, -1));
  if (Status st = reducer_.finish(); !st.ok()) {
    reducer_.drop();
    return st;
  }
  if (require_matching_) ZOE_RETURN_IF_ERROR(reducer_.check_matching());
  double handed = 0;  // hand-overs on this rank since the last step
  ZOE_RETURN_IF_ERROR(reducer_.reduce_rest(&handed));
  reducer_.drop();  // counted; what they reduced stays for this step
  double sumsq = 0;
  {
    ZOE_SPAN("grad_norm", "compute", Bucket::kOptimizer);
    ZOE_ASSIGN_OR_RETURN(sumsq, reducer_.owned_sumsq(&handed));
  }
  // Adam on nothing would still move the weights (decay, momentum): a step no rank gave a
  // gradient to is a caller's mistake, and every rank knows it from the same sum.
  if (handed == 0)
    return Status::Runtime("step() before any gradient: no rank called grads_ready since the last step");
  const double inv = mean_unscaled();
  bool overflow = !std::isfinite(sumsq);
  scaler_.update(overflow);
  res.step = steps_applied_;
  if (overflow && early) {
    ZOE_ASSIGN_OR_RETURN(res.update_taken_back, take_back_early_update(lr, std::nullopt, steps_applied_ + 1));
  }
  if (overflow) {
    speculate_next_ = false;
    res.grad_norm = sumsq;
    pending_ = res;
    pending_open_ = false;
    return res;
  }
  res.grad_norm = std::sqrt(sumsq) * inv;
  double coef = 1.0;
  if (cfg_.grad_clip > 0 && res.grad_norm > cfg_.grad_clip) coef = cfg_.grad_clip / (res.grad_norm + 1e-6);
  speculate_next_ = coef == 1.0;
  if (!plan_.shard_optimizer) {  // the second half of the all-reduce: everyone needs every gradient
    ZOE_SPAN("all_gather grads", "all_gather", Bucket::kWaitComm);
    for (int u = 0; u < num_units(); ++u) {
      const UnitSlot& s = layout_.slot(u);
      ZOE_RETURN_IF_ERROR(comm_.all_gather(grad_ptr(state_.grad_owned_offset(u)), grad_ptr(s.full_offset), s.chunk * gsize_));
    }
  }
  ++steps_applied_;
  const float scale = static_cast<float>(inv * coef);
  const bool confirmed = early && scale == early_scale_;  // the speculation held: bitwise this step
  if (early && !confirmed) {
    ZOE_ASSIGN_OR_RETURN(res.update_taken_back,
                         take_back_early_update(lr, inv * coef, steps_applied_));
  }
  if (!early) ZOE_RETURN_IF_ERROR(pass_.reset_counts());
  res.applied = true;
  res.step = steps_applied_;
  pending_ = res;
  pending_open_ = true;
  if (confirmed) pass_.open_all();
  else if (!early) start_update(lr, inv * coef, steps_applied_, false);
  if (plan_.shard_params) return res;  // each fetch waits for its own unit's update
  // Replicated parameters are all-gathered from their owners: every rank needs the whole update.
  ZOE_ASSIGN_OR_RETURN(res, flush());
  ZOE_RETURN_IF_ERROR(gather_replicated_params());
  return res;
}

// Gradients are sums over ranks and micro-steps of loss-scaled gradients: this averages and
// unscales them.
double ZeroEngine::mean_unscaled() const { return 1.0 / (scaler_.scale() * comm_.size() * cfg_.grad_accum); }

// The update begun in the backward stepped with the scale it assumed; the norm overruled it
// (clipped, or not finite). Where it has stepped nothing it just ends. Else it is finished as
// begun (the units not yet stepped too), then a pass takes every sub-group back from it and,
// unless the step is skipped, steps it with grad_scale: one more pass over the state, only on the
// steps clipping or overflow touches. True where something was taken back.
Result<bool> ZeroEngine::take_back_early_update(double lr, std::optional<double> grad_scale, int64_t step) {
  ZOE_SPAN("take back update", "adam", Bucket::kOptimizer);
  if (pass_.opened_this_pass() == 0) {  // nothing stepped yet (stages 0-1 release nothing early)
    pass_.cancel();
    ZOE_RETURN_IF_ERROR(pass_.reset_counts());
    if (grad_scale) start_update(lr, *grad_scale, step, false);
    return false;
  }
  pass_.open_all();
  ZOE_RETURN_IF_ERROR(pass_.wait());
  ZOE_RETURN_IF_ERROR(pass_.reset_counts());
  ++taken_back_;
  AdamHyper h = adam_hyper(lr, grad_scale.value_or(early_scale_), step);
  h.undo = true;
  h.undo_grad_scale = early_scale_;
  h.restore_only = !grad_scale.has_value();
  pass_.start(h);
  return true;
}

AdamHyper ZeroEngine::adam_hyper(double lr, double grad_scale, int64_t step) const {
  AdamHyper h;
  h.lr = lr;
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.weight_decay = cfg_.weight_decay;  // for ranges that take it (AdamRange::decay)
  h.decoupled = cfg_.adamw;
  h.step = step;
  h.grad_scale = static_cast<float>(grad_scale);
  return h;
}

void ZeroEngine::start_update(double lr, double grad_scale, int64_t step, bool in_backward) {
  const AdamHyper h = adam_hyper(lr, grad_scale, step);
  if (in_backward) {
    early_scale_ = h.grad_scale;
    pass_.start_in_backward(h);
  } else {
    pass_.start(h);
  }
}

Status ZeroEngine::wait_update() {
  if (early_lr_ && speculating_)
    return Status::Invalid("the update begun by update_during_backward() waits for step()");
  return pass_.wait();
}

Result<StepResult> ZeroEngine::flush() {
  {
    ZOE_SPAN("wait update", "adam", Bucket::kOptimizer);
    ZOE_RETURN_IF_ERROR(wait_update());
  }
  if (pending_open_) {
    ZOE_ASSIGN_OR_RETURN(OptimizerPass::Counts c, pass_.counts());
    pending_.nonfinite = c.nonfinite;
    pending_.host_stepped = c.host_stepped;
    pending_open_ = false;
  }
  if (plan_.shard_params) units_.prefetch();  // what waited for the update may start now
  return pending_;
}

// The low-precision weights are rewritten from the masters, piece by piece through host memory
// (the masters may live on NVMe).
Status ZeroEngine::commit_owned_state() {
  ZOE_RETURN_IF_ERROR(wait_update());
  pass_.drop_read_ahead();
  ZOE_RETURN_IF_ERROR(unload_all());
  if (cfg_.mixed_precision()) {
    std::vector<float> piece;
    for (int u = 0; u < num_units(); ++u)
      for (int64_t x = state_.opt_begin(u); x < state_.opt_end(u);) {
        int64_t k = std::min<int64_t>(state_.opt_end(u) - x, int64_t{1} << 22);
        piece.resize(k);
        ZOE_RETURN_IF_ERROR(state_.get_f32(state_.master(), DType::kF32, state_.opt_index(u, x), k, piece.data()));
        ZOE_RETURN_IF_ERROR(state_.put_f32(state_.param(), dtype_, state_.param_index(u, x), k, piece.data()));
        x += k;
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

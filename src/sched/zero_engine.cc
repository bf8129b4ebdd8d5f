#include "sched/zero_engine.h"

#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "common/profiler.h"
#include "common/status_of_call.h"
#include "cpu/adam.h"

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
                  : LossScaler::fixed(c.dtype == DType::kF16 ? c.static_loss_scale : 1.0)),
      gather_pool_(d, poison_released()),
      prefetch_(unit_elems(layout_), PrefetchLimits{c.prefetch_bucket_size, c.max_live_parameters, c.max_reuse_distance}) {
  gathered_.resize(layout_.num_units());
  residency_.assign(layout_.num_units(), Residency::kAbsent);
  local_seen_.assign(layout_.num_units(), 0);
  reduced_.assign(layout_.num_units(), 0);
  handed_here_.assign(layout_.num_units(), 0);
}

void ZeroEngine::set_activation_bytes(uint64_t bytes) {
  dev_.ledger().sub(Tier::kDevice, Kind::kActivation, activation_bytes_);
  dev_.ledger().add(Tier::kDevice, Kind::kActivation, bytes);
  activation_bytes_ = bytes;
}

ZeroEngine::~ZeroEngine() {
  (void)finish_reductions();
  comm_worker_.reset();
  if (update_thread_.joinable()) update_thread_.join();
  // Callers learn an update's failure from flush() or the next step; one that never asked (a
  // framework that frees the engine after its last step) is told here rather than not at all.
  if (Status lost = progress_.take_unreported(); !lost.ok())
    std::fprintf(stderr, "zoe: error: the engine's last optimizer update failed and no call returned it: %s\n",
                 lost.message().c_str());
  windows_.reset();  // waits for what it read ahead
  set_activation_bytes(0);
  for (auto& g : gathered_) {
    g.load.reset();  // waits for what it issued
    dev_.free(g.buf);
  }
  gather_pool_.trim();
  dev_.free(grad_);
  dev_.free(scalars_);
  for (StateArray* a : {&param_, &master_, &exp_avg_, &exp_avg_sq_}) a->release(dev_);
  for (auto& st : stores_) (void)st->close();
  if (pool_) dev_.unregister_host(pool_->base());
  comm_.set_device(nullptr);
}

namespace {

// The pinned pool: at most 1 GiB, at most a quarter of the host budget, at most what three
// windows of the state on NVMe need; the optimizer's sub-group is sub_group_size elements, or
// fewer when three of them do not fit in what the stores' I/O buffers leave of the pool.
constexpr uint64_t kMaxPoolBytes = uint64_t{1} << 30;

}  // namespace

// What the pinned pool holds per element of a sub-group: three optimizer windows of
// `optimizer_bytes` per element rotate, and beside them two windows of parameter chunks on their
// way to a gather (stage 3 loads them while the optimizer's pass runs on).
uint64_t ZeroEngine::pool_bytes_per_elem(uint64_t optimizer_bytes) const {
  bool param_nvme = cfg_.offload_param.device == OffloadDevice::kNvme;
  return 3 * optimizer_bytes + (param_nvme ? 2 * wsize_ : 0);
}

Status ZeroEngine::open_offload(int64_t opt_elems, int64_t param_elems) {
  std::vector<std::string> paths;
  for (const OffloadConfig* o : {&cfg_.offload_optimizer, &cfg_.offload_param})
    if (o->device == OffloadDevice::kNvme && std::find(paths.begin(), paths.end(), o->nvme_path) == paths.end())
      paths.push_back(o->nvme_path);
  if (paths.empty()) return Status::Ok();
  // Bytes per element the optimizer streams through its windows, and the most elements of one
  // kind on NVMe: the pool need not hold more than three windows of those.
  bool opt_nvme = cfg_.offload_optimizer.device == OffloadDevice::kNvme;
  bool param_nvme = cfg_.offload_param.device == OffloadDevice::kNvme;
  uint64_t per_elem = (opt_nvme ? (cfg_.mixed_precision() ? 12 : 8) : 0) + (param_nvme ? wsize_ : 0);
  auto on_nvme = [](bool nvme, const OffloadConfig& o, int64_t n) {
    return nvme ? offloaded_elems(Tier::kNvme, o.ratio, n) : int64_t{0};
  };
  int64_t most = std::max(on_nvme(opt_nvme, cfg_.offload_optimizer, opt_elems),
                          on_nvme(param_nvme, cfg_.offload_param, param_elems));
  uint64_t bounce = uint64_t{static_cast<uint32_t>(cfg_.aio_queue_depth)} * cfg_.aio_block_size;
  uint64_t io = paths.size() * bounce + (uint64_t{1} << 20);  // the stores' buffers, and slack
  uint64_t per_group = pool_bytes_per_elem(per_elem);
  uint64_t windows = per_group * static_cast<uint64_t>(std::max<int64_t>(1024, std::min(cfg_.sub_group_size, most)));
  uint64_t pool_bytes = std::min({kMaxPoolBytes, cfg_.host_memory_budget / 4, io + std::max(windows, uint64_t{3} << 20)});
  if (pool_bytes < io + 1024 * per_group)
    return Status::Invalid(fmt::format(
        "config key 'zoe.host_memory_budget': the NVMe tier's pinned pool (a quarter of it, {} bytes) cannot hold "
        "aio.queue_depth x aio.block_size = {} bytes of I/O buffers per store plus the optimizer's and the parameter loads' windows of 1024 elements",
        pool_bytes, bounce));
  // The job's name is rank 0's pid and random bits: jobs started from the same directory, or in
  // two containers whose pids coincide, get their own swap directories, and a dead job's are
  // recognised (unlocked) and removed by the next one.
  std::array<int64_t, 2> job = {getpid(), swap_job_tag()};
  ZOE_RETURN_IF_ERROR(comm_.broadcast(job.data(), sizeof(job), 0));
  bool pin = cfg_.offload_optimizer.pin_memory || cfg_.offload_param.pin_memory;
  ZOE_ASSIGN_OR_RETURN(pool_, PinnedPool::create({pool_bytes, pin, &dev_.ledger()}));
  // Adam and the copies read the windows in place: the device must reach the pool.
  ZOE_RETURN_IF_ERROR(dev_.register_host(pool_->base(), pool_->capacity()));
  windows_ = std::make_unique<OptimizerWindows>(dev_, *pool_, [this](int64_t a) { return host_adam(a); });
  for (const std::string& path : paths) {
    NvmeStoreOptions o;
    o.nvme_path = path;
    o.job = swap_job_name(job[0], static_cast<uint32_t>(job[1]));
    o.rank = comm_.rank();
    o.block_size = static_cast<uint32_t>(cfg_.aio_block_size);
    o.queue_depth = static_cast<unsigned>(cfg_.aio_queue_depth);
    o.checksums = cfg_.checksums;
    o.pool = pool_.get();
    o.pin_memory = pin;
    o.ledger = &dev_.ledger();
    // Every region this store will hold, so that its free-space check covers all of them before
    // anything is written (exit 2, needed vs free).
    std::vector<RegionSpec> regions;
    auto plan = [&](const OffloadConfig& oc, const char* name, int64_t n, size_t esize, bool optimizer) {
      int64_t off = offloaded_elems(Tier::kNvme, oc.ratio, n);
      if (oc.device == OffloadDevice::kNvme && oc.nvme_path == path && off > 0)
        regions.push_back(nvme_region(name, unit_starts(optimizer), n - off, n, esize, cfg_.aio_block_size));
    };
    // In fp32 training the master is the param array itself.
    plan(cfg_.offload_param, "param", param_elems, wsize_, /*optimizer=*/false);
    if (cfg_.mixed_precision()) plan(cfg_.offload_optimizer, "master", opt_elems, 4, true);
    plan(cfg_.offload_optimizer, "exp_avg", opt_elems, 4, true);
    plan(cfg_.offload_optimizer, "exp_avg_sq", opt_elems, 4, true);
    ZOE_ASSIGN_OR_RETURN(auto store, NvmeStore::open(o, regions));
    stores_.push_back(std::move(store));
    store_paths_.push_back(path);
  }
  uint64_t fit = (pool_->available() - (uint64_t{1} << 20)) / std::max<uint64_t>(per_group, 1);
  group_elems_ = std::max<int64_t>(1024, std::min<int64_t>(cfg_.sub_group_size, static_cast<int64_t>(fit)));
  // Sub-groups and parameter windows that cut a unit do so on a block boundary of every array
  // (a block holds block/2 elements of a 2-byte array, block/4 of the fp32 ones): no block is
  // shared by two windows.
  const int64_t grain = cfg_.aio_block_size / 2;
  if (group_elems_ >= grain) group_elems_ = group_elems_ / grain * grain;
  return Status::Ok();
}

ZeroEngine::SchedStats ZeroEngine::sched_stats() const {
  SchedStats s = stats_;
  s.deviations = trace_.deviations();
  s.adam_hashed_blocks = windows_ ? windows_->hashed_blocks() : 0;
  for (const auto& store : stores_) {
    NvmeStore::Traffic t = store->traffic();
    s.nvme_read_bytes += t.read_bytes;
    s.nvme_written_bytes += t.written_bytes;
    s.nvme_hashed_bytes += t.hashed_bytes;
    s.nvme_forwarded_bytes += t.forwarded_bytes;
  }
  return s;
}

std::vector<int64_t> ZeroEngine::unit_starts(bool optimizer) const {
  std::vector<int64_t> starts;
  for (int u = 0; u < num_units(); ++u) starts.push_back(optimizer ? opt_offset(u) : param_offset(u));
  return starts;
}

Status ZeroEngine::allocate() {
  const int64_t S = layout_.shard_size(), P = layout_.padded_params();
  comm_.set_device(&dev_);
  // The step's counters live on the device and are read back once per step.
  ZOE_ASSIGN_OR_RETURN(scalars_, dev_.alloc(sizeof(StepScalars), Tier::kDevice, Kind::kStaging));
  ZOE_RETURN_IF_ERROR(open_offload(plan_.shard_optimizer ? S : P, plan_.shard_params ? S : P));
  auto home = [&](const OffloadConfig& o, const char* region) {
    StateHome h;
    h.offload = o.device == OffloadDevice::kNone ? Tier::kDevice : o.device == OffloadDevice::kCpu ? Tier::kHost
                                                                                                    : Tier::kNvme;
    h.ratio = o.ratio;
    h.region = region;
    for (size_t i = 0; i < stores_.size(); ++i)
      if (o.device == OffloadDevice::kNvme && store_paths_[i] == o.nvme_path) h.store = stores_[i].get();
    return h;
  };
  int64_t opt_elems = plan_.shard_optimizer ? S : P;
  ZOE_RETURN_IF_ERROR(param_.allocate(dev_, home(cfg_.offload_param, "param"), plan_.shard_params ? S : P, wsize_,
                                      Kind::kParam, unit_starts(/*optimizer=*/false)));
  // ZeRO-Offload: with the optimizer off the device, the reduced gradient shard lives in pinned
  // host memory, where the host Adam reads it in place, and the device budget is left to the
  // weights in flight. Unsharded gradients accumulate on the device (every micro-step adds there).
  grads_on_host_ = plan_.shard_grads && cfg_.offload_optimizer.device != OffloadDevice::kNone;
  auto grad = dev_.alloc((plan_.shard_grads ? S : P) * gsize_, grads_on_host_ ? Tier::kHost : Tier::kDevice,
                         Kind::kGrad);
  if (!grad.ok() && grads_on_host_)
    return Status::OutOfMemory(fmt::format(
        "the gradient shard ({} bytes) lives in pinned host memory when the optimizer is offloaded: {}", S * gsize_,
        grad.status().message()));
  ZOE_ASSIGN_OR_RETURN(grad_, std::move(grad));
  ZOE_RETURN_IF_ERROR(dev_.zero(grad_.data, grad_.bytes));  // padding must be zero; first touch now
  const OffloadConfig& oo = cfg_.offload_optimizer;
  const std::vector<int64_t> opt_units = unit_starts(/*optimizer=*/true);
  if (cfg_.mixed_precision())
    ZOE_RETURN_IF_ERROR(master_.allocate(dev_, home(oo, "master"), opt_elems, 4, Kind::kMaster, opt_units));
  ZOE_RETURN_IF_ERROR(exp_avg_.allocate(dev_, home(oo, "exp_avg"), opt_elems, 4, Kind::kExpAvg, opt_units));
  ZOE_RETURN_IF_ERROR(exp_avg_sq_.allocate(dev_, home(oo, "exp_avg_sq"), opt_elems, 4, Kind::kExpAvgSq, opt_units));
  ZOE_RETURN_IF_ERROR(check_device_fits());
  return start_comm_worker();
}

// Sharded gradients are reduced on a communication thread of their own when the transport lets
// two threads run collectives (else, and without overlap_comm, at the hand-over) and the device
// has room for one more reduction buffer beside a unit in flight.
Status ZeroEngine::start_comm_worker() {
  if (!cfg_.overlap_comm || !plan_.shard_grads) return Status::Ok();
  uint64_t extra = 0;
  for (int u = 0; u < num_units(); ++u) extra = std::max<uint64_t>(extra, layout_.slot(u).full_size * gsize_);
  // Duplicating is collective: all ranks do, or none.
  uint8_t fits = reserve_ + extra <= device_free(dev_.ledger().snapshot());
  std::vector<uint8_t> all(comm_.size());
  ZOE_RETURN_IF_ERROR(comm_.all_gather_control(&fits, all.data(), 1));
  if (std::count(all.begin(), all.end(), 1) != comm_.size()) return Status::Ok();
  auto dup = comm_.duplicate();
  if (!dup.ok()) return dup.status().code() == Code::kUnsupported ? Status::Ok() : dup.status();
  comm_worker_ = std::make_unique<CommWorker>(std::move(*dup));
  reserve_ += extra;
  return Status::Ok();
}

// What one unit in flight needs on the device at once: its gathered weights (stage 3), the fp32
// gradient the model hands over, and its reduction buffer (stages 2-3).
uint64_t ZeroEngine::unit_device_need(int u) const {
  uint64_t full = layout_.slot(u).full_size;
  return full * ((plan_.shard_params ? wsize_ : 0) + 4 + (plan_.shard_grads ? gsize_ : 0));
}

uint64_t ZeroEngine::device_free(const LedgerSnapshot& l) const {
  uint64_t used = 0;
  for (uint64_t b : l.bytes[static_cast<int>(Tier::kDevice)]) used += b;
  return cfg_.device_memory_budget > used ? cfg_.device_memory_budget - used : 0;
}

// Whether `bytes` more can be held for the scheduler and still leave a unit in flight and the
// model's activations, as high as they have been at a fetch, room on the device: the budget is a
// hard limit for the model's allocations too, and they cannot evict.
bool ZeroEngine::has_room(uint64_t bytes) {
  LedgerSnapshot l = dev_.ledger().snapshot();
  uint64_t act = l.bytes[static_cast<int>(Tier::kDevice)][static_cast<int>(Kind::kActivation)];
  activation_peak_ = std::max(activation_peak_, act);
  return device_free(l) + act >= bytes + reserve_ + activation_peak_;
}

// A unit that cannot be in flight next to the persistent state is an error now, not an
// out-of-memory error in the middle of a step.
Status ZeroEngine::check_device_fits() {
  uint64_t budget = cfg_.device_memory_budget, left = device_free(dev_.ledger().snapshot());
  reserve_ = 0;
  for (int u = 0; u < num_units(); ++u) {
    uint64_t need = unit_device_need(u);
    reserve_ = std::max(reserve_, need);
    if (need > left)
      return Status::Invalid(fmt::format(
          "unit '{}' needs {} bytes on the device at once (its gathered weights, its fp32 gradient and its "
          "reduction buffer), but zoe.device_memory_budget ({} bytes) leaves {} after the persistent state ({} "
          "bytes): raise the budget or offload the state (offload_param, offload_optimizer)",
          unit(u).name, need, budget, left, budget - left));
  }
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
int64_t ZeroEngine::param_index(int u, int64_t x) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_params ? s.shard_offset + (x - comm_.rank() * s.chunk) : s.full_offset + x;
}

// Memory parts take fp32 as a plain upload (or download) and convert other dtypes on the device
// through a staging buffer; NVMe parts convert on the host inside a pinned window, piece by
// piece.
Status ZeroEngine::put_f32(StateArray& a, DType dt, int64_t e, int64_t n, const float* src) {
  while (n > 0) {
    int64_t k = std::min(n, a.part_end(e) - e);
    if (!a.on_nvme(e) && dt == DType::kF32) {  // no conversion: a plain upload
      ZOE_RETURN_IF_ERROR(dev_.upload(a.ptr(e), src, k * 4));
    } else if (!a.on_nvme(e)) {
      ZOE_ASSIGN_OR_RETURN(Buffer staging, dev_.alloc(k * 4, Tier::kDevice, Kind::kStaging));
      Status st = dev_.upload(staging.data, src, k * 4);
      if (st.ok()) st = dev_.accumulate(a.ptr(e), dt, staging.data, DType::kF32, k, false);
      dev_.free(staging);
      ZOE_RETURN_IF_ERROR(st);
    } else {
      k = std::min<int64_t>(k, group_elems_);
      ZOE_ASSIGN_OR_RETURN(PinnedPool::Lease w, pool_->acquire(k * a.esize()));
      for (int64_t i = 0; i < k; ++i) store_from_f32(w.data(), dt, i, src[i]);
      ZOE_RETURN_IF_ERROR(a.wait(a.write_async(e, k, w.data())));
    }
    e += k, src += k, n -= k;
  }
  return Status::Ok();
}

Status ZeroEngine::get_f32(const StateArray& a, DType dt, int64_t e, int64_t n, float* dst) {
  while (n > 0) {
    int64_t k = std::min(n, a.part_end(e) - e);
    if (!a.on_nvme(e)) {
      ZOE_RETURN_IF_ERROR(download_f32(dev_, dst, a.ptr(e), dt, k));
    } else {
      k = std::min<int64_t>(k, group_elems_);
      ZOE_ASSIGN_OR_RETURN(PinnedPool::Lease w, pool_->acquire(k * a.esize()));
      ZOE_RETURN_IF_ERROR(a.wait(a.read_async(e, k, w.data())));
      for (int64_t i = 0; i < k; ++i) dst[i] = load_as_f32(w.data(), dt, i);
    }
    e += k, dst += k, n -= k;
  }
  return Status::Ok();
}

std::unique_ptr<ChunkLoad> ZeroEngine::chunk_load(int u, const Buffer& dst) {
  const UnitSlot& s = layout_.slot(u);
  return std::make_unique<ChunkLoad>(dev_, pool_.get(), param_, s.shard_offset, s.chunk, dst,
                                     comm_.rank() * s.chunk * wsize_, group_elems_);
}

// Where owned elements [begin, end) of unit u's kind k are: in fp32 training the master is the
// parameter array itself, in the weight dtype and at parameter positions.
Result<ZeroEngine::OwnedPlace> ZeroEngine::owned_place(const char* op, int u, OwnedKind k, int64_t begin,
                                                       int64_t end) {
  if (u < 0 || u >= num_units() || begin < opt_begin(u) || end > opt_end(u) || begin > end)
    return Status::Invalid(fmt::format("{}: [{}, {}) is not owned in unit {}", op, begin, end, u));
  if (k == OwnedKind::kMaster && !cfg_.mixed_precision()) return OwnedPlace{&param_, dtype_, param_index(u, begin)};
  return OwnedPlace{&owned_array(k), DType::kF32, opt_index(u, begin)};
}

Status ZeroEngine::read_owned(int u, OwnedKind k, int64_t begin, int64_t end, float* dst) {
  ZOE_RETURN_IF_ERROR(wait_update());
  ZOE_ASSIGN_OR_RETURN(OwnedPlace p, owned_place("read_owned", u, k, begin, end));
  return get_f32(*p.array, p.dtype, p.index, end - begin, dst);
}

Status ZeroEngine::write_owned(int u, OwnedKind k, int64_t begin, int64_t end, const float* src) {
  ZOE_RETURN_IF_ERROR(wait_update());
  drop_read_ahead();
  ZOE_RETURN_IF_ERROR(unload_all());
  ZOE_ASSIGN_OR_RETURN(OwnedPlace p, owned_place("write_owned", u, k, begin, end));
  return put_f32(*p.array, p.dtype, p.index, end - begin, src);
}

Status ZeroEngine::set_params(int u, const float* values) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("unit {} out of range", u));
  ZOE_RETURN_IF_ERROR(wait_update());
  drop_read_ahead();
  ZOE_RETURN_IF_ERROR(unload_all());
  const UnitSlot& s = layout_.slot(u);
  // Replicated params hold the whole unit; sharded ones only this rank's chunk (none of it when
  // the chunk is all padding).
  int64_t lo = plan_.shard_params ? std::min(comm_.rank() * s.chunk, s.numel) : 0;
  int64_t hi = plan_.shard_params ? lo + layout_.owned_real(u, comm_.rank()) : s.numel;
  if (hi > lo) ZOE_RETURN_IF_ERROR(put_f32(param_, dtype_, param_index(u, lo), hi - lo, values + lo));
  if (cfg_.mixed_precision() && opt_end(u) > opt_begin(u))
    ZOE_RETURN_IF_ERROR(put_f32(master_, DType::kF32, opt_index(u, opt_begin(u)), opt_end(u) - opt_begin(u),
                                values + opt_begin(u)));
  return Status::Ok();
}

Result<ParamView> ZeroEngine::fetch(int u) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("fetch: unit {} out of range", u));
  const UnitSlot& s = layout_.slot(u);
  if (!plan_.shard_params) return ParamView{param_.ptr(s.full_offset), dtype_, s.numel};
  Gathered& g = gathered_[u];
  if (g.refs > 0) {  // nested: already gathered
    ++g.refs;
    return ParamView{g.buf.data, dtype_, s.numel};
  }
  if (!trace_.observe(u) && !trace_.plan().empty() && !told_deviation_ && comm_.rank() == 0) {
    told_deviation_ = true;
    std::fprintf(stderr, "zoe: warning: a step fetched unit '%s' out of the recorded order: prefetching stops for "
                 "this step and follows the new order from the next one\n", unit(u).name.c_str());
  }
  // Kept units need no gather here; but every rank gathers when any rank must (their residency
  // may differ: a full device evicts), so collectives always match.
  bool need = residency_[u] != Residency::kGathered;
  AheadGather ahead = ahead_candidate(u);
  ZOE_RETURN_IF_ERROR(sync_point(OpKind::kFetch, u, nullptr, &need, &ahead));
  if (ahead.go) start_gather_ahead(ahead.v);  // every rank that agreed enters it
  bool came_ahead = g.gathering != 0;
  ZOE_RETURN_IF_ERROR(wait_gathered(u));
  stats_.fetched_kept += !need && !came_ahead;
  stats_.fetched_loading +=
      came_ahead || residency_[u] == Residency::kLoading || residency_[u] == Residency::kStaged;
  if (need) {
    ZOE_RETURN_IF_ERROR(wait_updated(u));  // our chunk must be this step's
    if (residency_[u] != Residency::kLoading && residency_[u] != Residency::kGathered) {
      auto buf = gather_buffer(u);
      if (!buf.ok()) {
        (void)unload(u);  // a staged load's windows go back too (it has no gather: waited above)
        return buf.status();
      }
      g.buf = *buf;
      if (g.load) g.load->set_destination(g.buf);  // staged: its reads are on their way
      else g.load = chunk_load(u, g.buf);
    }
    Status st = g.load ? g.load->finish() : Status::Ok();  // our chunk, from its home tier
    g.load.reset();
    size_t chunk_bytes = s.chunk * wsize_;
    if (st.ok()) {
      ZOE_SPAN("all_gather " + unit(u).name, "all_gather", Bucket::kWaitComm);
      st = comm_.all_gather(g.buf.as<char>() + comm_.rank() * chunk_bytes, g.buf.data, chunk_bytes);
    }
    if (!st.ok()) {  // nothing half-gathered stays behind
      gather_pool_.give_back(g.buf);
      residency_[u] = Residency::kAbsent;
      return st;
    }
  }
  residency_[u] = Residency::kGathered;
  g.refs = 1;
  prefetch_ahead();
  advance_loads();
  return ParamView{g.buf.data, dtype_, s.numel};
}

Status ZeroEngine::release(int u) {
  if (u < 0 || u >= num_units()) return Status::Invalid(fmt::format("release: unit {} out of range", u));
  if (!plan_.shard_params) return Status::Ok();
  Gathered& g = gathered_[u];
  if (g.refs == 0) return Status::Runtime(fmt::format("release of unit '{}' that is not fetched", unit(u).name));
  if (--g.refs > 0) return Status::Ok();
  bool room = has_room(0);
  if (!room || !trace_.following() || !prefetch_.keep(trace_.plan(), trace_.next(), u, residency_))
    ZOE_RETURN_IF_ERROR(unload(u));
  prefetch_ahead();
  advance_loads();
  return Status::Ok();
}

// Loads ahead whose reads have landed start their copies to the device now, beside the compute,
// not when their fetch comes (a load gathering on the communication thread is that thread's).
void ZeroEngine::advance_loads() {
  for (int v = 0; v < num_units(); ++v) {
    Gathered& g = gathered_[v];
    if (g.load && g.gathering == 0 && residency_[v] == Residency::kLoading) stats_.copied_ahead += g.load->advance();
  }
}

Status ZeroEngine::unload(int u) {
  Gathered& g = gathered_[u];
  Status gathered = wait_gathered(u);
  g.load.reset();  // waits for its reads and copies (a load ahead that failed was never used)
  gather_pool_.give_back(g.buf);
  residency_[u] = Residency::kAbsent;
  return gathered;
}

Status ZeroEngine::unload_all() {
  Status first;
  for (int u = 0; u < num_units(); ++u)
    if (gathered_[u].refs == 0 && residency_[u] != Residency::kAbsent) {
      Status st = unload(u);
      if (first.ok()) first = st;
    }
  return first;
}

// The unit the plan fetches after u, and whether this rank could gather it right away: gathered
// already, or its chunk loading into a gather buffer with every read issued (so the
// communication thread, which finishes the load, never waits for a pinned window).
ZeroEngine::AheadGather ZeroEngine::ahead_candidate(int u) const {
  AheadGather a;
  if (!comm_worker_ || !trace_.following() || trace_.next() >= trace_.plan().size()) return a;
  int v = trace_.plan()[trace_.next()];
  if (v == u) return a;
  const Gathered& g = gathered_[v];
  a.v = v;
  a.needs = residency_[v] != Residency::kGathered;
  a.ready = g.gathering == 0 && g.refs == 0 &&
            (residency_[v] == Residency::kGathered ||
             (residency_[v] == Residency::kLoading && g.load && g.load->all_issued()));
  return a;
}

// Unit v's all-gather on the communication thread, one fetch ahead of v's: the load of our chunk
// finishes there too (a unit gathered already is gathered again in place).
void ZeroEngine::start_gather_ahead(int v) {
  Gathered& g = gathered_[v];
  size_t chunk_bytes = layout_.slot(v).chunk * wsize_;
  char* buf = g.buf.as<char>();
  g.gathering = comm_worker_->submit(
      [load = g.load.get(), buf, chunk_bytes, r = comm_.rank(), name = unit(v).name](Comm& c) {
        Status st = load ? load->finish() : Status::Ok();
        // The other ranks are in this collective: enter it even after a failed load.
        ZOE_SPAN("all_gather " + name, "all_gather", Bucket::kWaitComm);
        Status gathered = c.all_gather(buf + r * chunk_bytes, buf, chunk_bytes);
        return st.ok() ? gathered : st;
      });
  residency_[v] = Residency::kGathered;
  ++stats_.gathered_ahead;
}

Status ZeroEngine::wait_gathered(int u) {
  Gathered& g = gathered_[u];
  if (!g.gathering) return Status::Ok();
  Status st;
  {
    ZOE_SPAN("wait all_gather " + unit(u).name, "all_gather", Bucket::kWaitComm);
    st = comm_worker_->wait(g.gathering);
  }
  g.gathering = 0;
  g.load.reset();
  if (!st.ok()) {  // nothing half-gathered stays behind
    gather_pool_.give_back(g.buf);
    residency_[u] = Residency::kAbsent;
  }
  return st;
}

// Prefetching is an optimisation: whatever fails here (no room, a read that cannot start) is
// left to the fetch, which does the same work and reports the error. Without device room a chunk
// that lives on NVMe is still read ahead, into pinned host memory (staged): its fetch then only
// uploads and gathers.
void ZeroEngine::prefetch_ahead() {
  if (!plan_.shard_params || !trace_.following()) return;
  for (int v : prefetch_.ahead(trace_.plan(), trace_.next(), residency_)) {
    if (!progress_.updated(opt_stop(v))) return;  // not this step's yet
    Gathered& g = gathered_[v];
    size_t bytes = layout_.slot(v).full_size * wsize_;
    g.buf = Buffer();
    if (has_room(bytes)) {
      auto buf = gather_pool_.acquire(bytes);
      if (buf.ok()) g.buf = *buf;
    }
    g.load = chunk_load(v, g.buf);
    bool staged = !g.buf;
    if ((staged && g.load->has_memory_parts()) || !g.load->start().ok() || (staged && !g.load->reading())) {
      (void)unload(v);  // a load just made, never gathered: nothing to report
      return;
    }
    residency_[v] = staged ? Residency::kStaged : Residency::kLoading;
    ++stats_.loads_ahead;
    stats_.staged_ahead += staged;
  }
}

// A gather buffer for a fetch: when the device is full, units kept for reuse make room first.
Result<Buffer> ZeroEngine::gather_buffer(int u) {
  size_t bytes = layout_.slot(u).full_size * wsize_;
  auto b = after_reductions_if_full([&] { return gather_pool_.acquire(bytes); });
  for (int v = 0; !b.ok() && b.status().code() == Code::kOutOfMemory && v < num_units(); ++v) {
    if (v == u || gathered_[v].refs > 0 || residency_[v] == Residency::kAbsent || !gathered_[v].buf) continue;
    ZOE_RETURN_IF_ERROR(unload(v));  // its buffer goes back to the pool, which frees idle ones when full
    ++stats_.evicted;
    b = gather_pool_.acquire(bytes);
  }
  return b;
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
    ZOE_RETURN_IF_ERROR(wait_updated(u));  // the update still reads this unit's gradient
    ZOE_RETURN_IF_ERROR(
        dev_.accumulate(grad_ptr(s.full_offset), gdtype_, grad, DType::kF32, s.numel, local_seen_[u] > 0));
    ++local_seen_[u];  // only once the gradient is really in
    ++handed_here_[u];
    return Status::Ok();
  }
  Status st = sync_point(OpKind::kGrads, u, grad);
  handed_here_[u] += st.ok();
  return st;
}

Status ZeroEngine::sync_point(OpKind kind, int u, const float* grad, bool* need, AheadGather* ahead) {
  if (comm_.size() == 1) return kind == OpKind::kGrads ? reduce_sharded_grad(u, grad) : Status::Ok();
  const int n = comm_.size();
  constexpr int kWords = 5;  // kind, unit, need, ahead unit, ahead flags (1 ready, 2 needs)
  int32_t mine[kWords] = {static_cast<int32_t>(kind), u, need && *need ? 1 : 0, ahead ? ahead->v : -1,
                          ahead ? (ahead->ready ? 1 : 0) | (ahead->needs ? 2 : 0) : 0};
  std::vector<int32_t> all(kWords * n);
  for (;;) {
    ZOE_RETURN_IF_ERROR(comm_.all_gather_control(mine, all.data(), sizeof(mine)));
    bool same = true, any_need = false, ahead_ok = all[3] >= 0, ahead_needed = false;
    for (int r = 0; r < n; ++r) {
      const int32_t* w = &all[kWords * r];
      same &= w[0] == all[0] && w[1] == all[1];
      any_need |= w[2] != 0;
      ahead_ok &= w[3] == all[3] && (w[4] & 1);
      ahead_needed |= (w[4] & 2) != 0;
    }
    if (same && need) *need = any_need;
    if (same && ahead) ahead->go = ahead_ok && ahead_needed;
    if (same) return kind == OpKind::kGrads ? reduce_sharded_grad(u, grad) : Status::Ok();
    // Ranks differ. Gradients handed over anywhere are reduced now, in unit order, with zeros
    // from the ranks that have none for that unit; those ranks' calls are then done.
    std::vector<int> units;
    for (int r = 0; r < n; ++r)
      if (all[kWords * r] == static_cast<int32_t>(OpKind::kGrads)) units.push_back(all[kWords * r + 1]);
    if (units.empty()) {
      auto what = [&](int r) {
        auto k = static_cast<OpKind>(all[kWords * r]);
        int v = all[kWords * r + 1];
        return k == OpKind::kStep ? std::string("step()")
                                  : fmt::format("{}('{}')", k == OpKind::kFetch ? "fetch" : "grads_ready",
                                                v >= 0 && v < num_units() ? unit(v).name : "?");
      };
      int other = 1;
      while (other < n && all[kWords * other] == all[0] && all[kWords * other + 1] == all[1]) ++other;
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

// Sharded gradients: this micro-step's gradient of unit u (zeros when grad is null) is reduced;
// only our chunk is kept, summed into what earlier reductions this step left there. With a
// communication thread the reduction runs there while the caller's backward goes on.
Status ZeroEngine::reduce_sharded_grad(int u, const float* grad) {
  ZOE_RETURN_IF_ERROR(wait_updated(u));  // any unit: other ranks' hand-overs are served here too
  const UnitSlot& s = layout_.slot(u);
  ZOE_ASSIGN_OR_RETURN(Buffer buf, after_reductions_if_full([&] {
    return dev_.alloc(s.full_size * gsize_, Tier::kDevice, Kind::kComm);
  }));
  Status st = grad ? dev_.accumulate(buf.data, gdtype_, grad, DType::kF32, s.numel, false)
                   : dev_.zero(buf.data, s.numel * gsize_);
  if (st.ok()) st = dev_.zero(buf.as<char>() + s.numel * gsize_, (s.full_size - s.numel) * gsize_);
  CommWorker::Job job = reduction_job(u, buf, reduced_[u] == 0);
  if (!st.ok() || !comm_worker_) {
    if (st.ok()) st = job(comm_);
    dev_.free(buf);
    if (st.ok()) ++reduced_[u];
    return st;
  }
  ++reduced_[u];
  reducing_.push_back({comm_worker_->submit(std::move(job)), buf, s.full_size});
  reducing_elems_ += s.full_size;
  ++stats_.reductions_async;
  // In flight after a hand-over: one unit's reduction (the device reserve holds its buffer beside
  // the next unit's) of at most reduce_bucket_size elements.
  return reap_reductions(1, cfg_.reduce_bucket_size);
}

// The reduce-scatter of a unit's gradient in `buf` into our owned chunk: the first of a step
// writes it, later micro-steps' add to it (in the gradient dtype, as the serial order did).
// Collectives move device memory only: a host gradient shard gets the reduced chunk in `buf`
// by a copy (the first), or by a kernel adding it (device-reachable host memory).
CommWorker::Job ZeroEngine::reduction_job(int u, const Buffer& buf, bool first) {
  const UnitSlot& s = layout_.slot(u);
  char* dst = grad_ptr(grad_owned_offset(u));
  char* own = buf.as<char>() + comm_.rank() * s.chunk * gsize_;
  bool direct = first && !grads_on_host_;
  return [this, name = unit(u).name, src = buf.data, dst, own, chunk = s.chunk, first, direct](Comm& c) {
    ZOE_SPAN("reduce_scatter " + name, "reduce_scatter", Bucket::kWaitComm);
    Status st = c.reduce_scatter(src, direct ? dst : own, chunk, gdtype_);
    if (st.ok() && !direct)
      st = first ? dev_.copy(dst, own, chunk * gsize_, Stream::kCompute)
                 : dev_.accumulate(dst, gdtype_, own, gdtype_, chunk, true);
    return st;
  };
}

// An allocation that finds the device full is tried once more after the reductions in flight
// have given their buffers back.
Result<Buffer> ZeroEngine::after_reductions_if_full(const std::function<Result<Buffer>()>& alloc) {
  auto b = alloc();
  if (b.ok() || b.status().code() != Code::kOutOfMemory || reducing_.empty()) return b;
  ZOE_RETURN_IF_ERROR(finish_reductions());
  return alloc();
}

// The first error is returned; every buffer goes back anyway.
Status ZeroEngine::reap_reductions(size_t units, int64_t elems) {
  Status first;
  while (!reducing_.empty() && (reducing_.size() > units || reducing_elems_ > elems)) {
    Reduction r = reducing_.front();
    reducing_.pop_front();
    Status st;
    {
      ZOE_SPAN("wait reduce_scatter", "reduce_scatter", Bucket::kWaitComm);
      st = comm_worker_->wait(r.ticket);
    }
    dev_.free(r.buf);
    reducing_elems_ -= r.elems;
    if (first.ok()) first = st;
  }
  if (comm_worker_) comm_.add_bytes(comm_worker_->take_bytes());
  return first;
}

// Every rank is at step() (after the step's agreement): the units each handed over must be the
// same, else all fail alike and the step's gradients are dropped.
Status ZeroEngine::check_matching_grads() {
  const int n = num_units(), ranks = comm_.size();
  if (ranks == 1) return Status::Ok();
  std::vector<uint8_t> mine(n), all(static_cast<size_t>(n) * ranks);
  for (int u = 0; u < n; ++u) mine[u] = handed_here_[u] > 0;
  ZOE_RETURN_IF_ERROR(comm_.all_gather_control(mine.data(), all.data(), n));
  for (int u = 0; u < n; ++u)
    for (int r = 1; r < ranks; ++r) {
      if (all[static_cast<size_t>(r) * n + u] == all[u]) continue;
      drop_step_grads();
      int with = all[u] ? 0 : r, without = all[u] ? r : 0;
      return Status::Runtime(fmt::format(
          "step(): rank {} handed over a gradient of unit '{}' and rank {} did not: every rank must hand over the "
          "same units (zeros where it has none); this step's gradients are dropped and no update is applied",
          with, unit(u).name, without));
    }
  return Status::Ok();
}

// The next hand-over of every unit starts afresh (overwrites instead of adding).
void ZeroEngine::drop_step_grads() {
  (void)finish_reductions();  // nothing may still write an owned chunk
  std::fill(local_seen_.begin(), local_seen_.end(), 0);
  std::fill(reduced_.begin(), reduced_.end(), 0);
  std::fill(handed_here_.begin(), handed_here_.end(), 0);
}

// One kernel over every owned chunk, one 8-byte read-back, then the all-reduce in rank order;
// *handed (this rank's hand-over count) is summed over ranks in the same all-reduce.
Result<double> ZeroEngine::owned_grad_sumsq(double* handed) {
  std::vector<ArrayView> spans;
  for (int u = 0; u < num_units(); ++u)
    spans.push_back({grad_ptr(grad_owned_offset(u)), gdtype_, static_cast<size_t>(layout_.owned_real(u, comm_.rank()))});
  auto* sc = scalars_.as<StepScalars>();
  ZOE_RETURN_IF_ERROR(dev_.zero(&sc->sumsq, sizeof(double)));
  ZOE_RETURN_IF_ERROR(dev_.sum_squares(spans.data(), spans.size(), &sc->sumsq));
  double v[2] = {0, *handed};
  ZOE_RETURN_IF_ERROR(dev_.download(&v[0], &sc->sumsq, sizeof(double)));
  ZOE_RETURN_IF_ERROR(comm_.all_reduce_sum(v, 2));
  *handed = v[1];
  return v[0];
}

// One tensor segment of the optimizer range (or the part of one inside a sub-group).
struct ZeroEngine::AdamTask {
  int64_t e = 0, n = 0;  // optimizer index of the first element, and the count
  bool decay = false;
  const char* grad = nullptr;
  int u = 0;
  int64_t x = 0;  // unit-relative element of the first
};

std::vector<ZeroEngine::AdamTask> ZeroEngine::adam_tasks() {
  std::vector<AdamTask> tasks;
  for (int u = 0; u < num_units(); ++u) {
    const UnitSlot& s = layout_.slot(u);
    int64_t lo = opt_begin(u), hi = opt_end(u);
    const char* g = plan_.shard_optimizer ? grad_ptr(grad_owned_offset(u)) : grad_ptr(s.full_offset);
    for (const Segment& seg : layout_.segments(u, lo, hi))
      tasks.push_back({opt_index(u, lo + seg.begin), seg.end - seg.begin, seg.decay, g + seg.begin * gsize_, u,
                       lo + seg.begin});
  }
  return tasks;
}

// In fp32 training the master is the parameter array itself (slot 0), never also slot 3.
WindowLayout ZeroEngine::window_layout() {
  WindowLayout wl;
  StateArray* slots_of[4] = {&master(), &exp_avg_, &exp_avg_sq_,
                             plan_.shard_params && cfg_.mixed_precision() ? &param_ : nullptr};
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
      const bool hot = cfg_.checksums && grid && 4 % x.esize() == 0 && x.same_segments(*grid);
      // The weights (the master itself in fp32 training) go back in the foreground: the next
      // forward reads them.
      wl.arrays.push_back({i, slots_of[i], i < 3, wl.per_elem, hot, /*background_write=*/slots_of[i] != &param_});
      wl.per_elem += x.esize();
    }
  wl.pool_keep_per_elem = pool_bytes_per_elem(wl.per_elem);
  return wl;
}

// Sub-groups: at most group_elems_ when streaming, sub_group_size where the state is in host
// memory (its gradients are staged there), cut where any array changes part and where a unit
// ends (the next forward waits for its units one by one).
SubGroups ZeroEngine::adam_groups(const std::vector<AdamTask>& tasks, bool streaming) {
  auto limit = [&](int64_t e) {
    return streaming ? group_elems_ : exp_avg_.in_device_memory(e) ? int64_t{1} << 60 : cfg_.sub_group_size;
  };
  SubGroups groups;
  for (const AdamTask& t : tasks)
    for (int64_t e = t.e; e < t.e + t.n;) {
      if (groups.empty() || e >= groups.back().second) {
        int64_t b = e + limit(e);
        for (StateArray* a : {&master(), &exp_avg_, &exp_avg_sq_}) b = std::min(b, a->part_end(e));
        if (plan_.shard_params) b = std::min(b, param_.part_end(e));
        b = std::min(b, opt_stop(t.u));
        groups.push_back({e, b});
      }
      e = std::min(t.e + t.n, groups.back().second);
    }
  return groups;
}

// Adam over the rank's optimizer range in sub-groups [a, b) that never cross a part boundary of
// any array: memory parts are stepped in place, NVMe parts through windows of pinned memory.
Status ZeroEngine::apply_adam(double lr, double grad_scale) {
  AdamHyper h;
  h.lr = lr;
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.weight_decay = cfg_.weight_decay;  // for ranges that take it (AdamRange::decay)
  h.decoupled = cfg_.adamw;
  h.step = steps_applied_;
  h.grad_scale = static_cast<float>(grad_scale);
  ZOE_SPAN("adam", "adam", Bucket::kOptimizer);
  std::vector<AdamTask> tasks = adam_tasks();
  WindowLayout wl = window_layout();
  SubGroups groups = adam_groups(tasks, !wl.arrays.empty());
  // ZeRO-Offload: sub-groups whose state is not device memory are stepped by the CPU Adam on the
  // host, their gradients staged in pinned host memory (see run_host_adam_group).
  HostStaging staging;
  ZOE_RETURN_IF_ERROR(staging.prepare(*this, groups));
  GroupStep step_group = [&](int64_t a, int64_t b, const std::array<char*, 4>& w,
                             const std::vector<HashedArray>* hashed) {
    return host_adam(a) ? run_host_adam_group(tasks, a, b, w, h, staging, hashed)
                        : run_adam_group(tasks, a, b, w, h);
  };
  if (!wl.arrays.empty()) {
    std::vector<std::pair<int64_t, int64_t>> written;  // sorted: tasks are in optimizer order
    for (const AdamTask& t : tasks) written.push_back({t.e, t.e + t.n});
    return windows_->run(groups, written, wl, step_group, [&](int64_t b) { progress_.advance(b); });
  }
  for (auto [a, b] : groups) {  // all in memory: in place
    ZOE_RETURN_IF_ERROR(step_group(a, b, {}, nullptr));
    progress_.advance(b);
  }
  return Status::Ok();
}

// The Adam ranges of the parts of `tasks` inside optimizer indices [a, b). win[i] holds element a
// of master, exp_avg, exp_avg_sq and the low-precision parameters when that array is in a window
// for this sub-group; null means it is in memory. Each range also says where its master and its
// weight copy are (array indices), for the host path to stage what is device memory.
std::vector<ZeroEngine::GroupRange> ZeroEngine::group_ranges(const std::vector<AdamTask>& tasks, int64_t a, int64_t b,
                                                             const std::array<char*, 4>& win) {
  StateArray* arrays[3] = {&master(), &exp_avg_, &exp_avg_sq_};
  auto at = [&](int i, int64_t e) { return win[i] ? win[i] + (e - a) * arrays[i]->esize() : arrays[i]->ptr(e); };
  std::vector<GroupRange> out;
  for (const AdamTask& t : tasks) {
    int64_t e0 = std::max(t.e, a), e1 = std::min(t.e + t.n, b);
    if (e0 >= e1) continue;
    int64_t x = t.x + (e0 - t.e);  // unit element of e0
    GroupRange g;
    g.e = e0;
    AdamRange& r = g.r;
    r.decay = t.decay;
    r.grad = t.grad + (e0 - t.e) * gsize_;
    r.grad_dtype = gdtype_;
    // In fp32 training the master is the parameter array, indexed by parameter position (the
    // same as the optimizer's only at stages 0 and 3, the only ones where it may be windowed).
    g.master_at = cfg_.mixed_precision() || win[0] ? e0 : param_index(t.u, x);
    g.param_at = param_index(t.u, x);
    r.master = reinterpret_cast<float*>(cfg_.mixed_precision() || win[0] ? at(0, e0) : param_.ptr(g.param_at));
    r.exp_avg = reinterpret_cast<float*>(at(1, e0));
    r.exp_avg_sq = reinterpret_cast<float*>(at(2, e0));
    if (cfg_.mixed_precision()) r.param_out = win[3] ? win[3] + (e0 - a) * wsize_ : param_.ptr(g.param_at);
    r.param_dtype = dtype_;
    r.n = e1 - e0;
    out.push_back(g);
  }
  return out;
}

// Sub-group [a, b) in device memory (or device-reachable windows): one launch of the device kernel.
Status ZeroEngine::run_adam_group(const std::vector<AdamTask>& tasks, int64_t a, int64_t b,
                                  const std::array<char*, 4>& win, AdamHyper h) {
  std::vector<AdamRange> ranges;
  for (const GroupRange& g : group_ranges(tasks, a, b, win)) ranges.push_back(g.r);
  return dev_.adam(h, ranges.data(), ranges.size(), &scalars_.as<StepScalars>()->nonfinite);
}

Status ZeroEngine::HostStaging::prepare(ZeroEngine& e, const std::vector<std::pair<int64_t, int64_t>>& groups) {
  dev = &e.dev_;
  int64_t most = 0;
  for (auto [a, b] : groups)
    if (!e.exp_avg_.in_device_memory(a)) most = std::max(most, b - a);
  grad_bytes = e.grads_on_host_ ? 0 : e.gsize_;  // host gradients are read in place
  master_bytes = e.master().split() > 0 ? 4 : 0;
  weight_bytes = e.cfg_.mixed_precision() && e.param_.split() > 0 ? e.wsize_ : 0;
  size_t per = grad_bytes + master_bytes + weight_bytes;
  if (most == 0 || per == 0) return Status::Ok();
  ZOE_ASSIGN_OR_RETURN(buf, dev->alloc(most * per, Tier::kHost, Kind::kStaging));
  return Status::Ok();
}

ZeroEngine::HostStaging::~HostStaging() {
  if (dev) dev->free(buf);
}

// The CPU Adam (AVX-512 / AVX2, chosen at run time) over sub-group [a, b), whose state is host
// memory or an NVMe window: device gradients come down into `staging` first (host ones,
// grads_on_host_, are read in place); arrays still in device memory (the weight copy; the fp32
// weights in fp32 training) are stepped in staging and go back up. Bitwise the device kernel's
// result: all Adam paths agree bit for bit.
Status ZeroEngine::run_host_adam_group(const std::vector<AdamTask>& tasks, int64_t a, int64_t b,
                                       const std::array<char*, 4>& win, AdamHyper h, const HostStaging& staging,
                                       const std::vector<HashedArray>* hashed) {
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
  ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kD2H, dev_.record(Stream::kCompute)));  // gradients are done
  int64_t k = 0;  // staging offset of the range, in elements
  for (GroupRange& g : ranges) {
    AdamRange& r = g.r;
    if (!grads_on_host_) {
      ZOE_RETURN_IF_ERROR(dev_.copy(grads + k * gsize_, r.grad, r.n * gsize_, Stream::kD2H));
      r.grad = grads + k * gsize_;
    }
    if (!win[0] && master().in_device_memory(g.master_at)) {
      float* staged = reinterpret_cast<float*>(masters + k * 4);
      ZOE_RETURN_IF_ERROR(dev_.copy(staged, r.master, r.n * 4, Stream::kD2H));
      ups.push_back({r.master, staged, r.n * 4});
      r.master = staged;
    }
    if (r.param_out && !win[3] && param_.in_device_memory(g.param_at)) {
      ups.push_back({r.param_out, weights + k * wsize_, r.n * wsize_});
      r.param_out = weights + k * wsize_;
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
  for (const Up& u : ups) ZOE_RETURN_IF_ERROR(dev_.copy(u.dst, u.src, u.bytes, Stream::kH2D));
  // The staging is reused by the next sub-group, and the compute stream reads the weights next.
  Event up = dev_.record(Stream::kH2D);
  ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kCompute, up));
  return dev_.wait(up);
}

Status ZeroEngine::gather_replicated_params() {
  if (!plan_.shard_optimizer || plan_.shard_params) return Status::Ok();
  ZOE_SPAN("all_gather params", "all_gather", Bucket::kWaitComm);
  for (int u = 0; u < num_units(); ++u) {
    const UnitSlot& s = layout_.slot(u);
    ZOE_RETURN_IF_ERROR(comm_.all_gather(param_.ptr(s.full_offset + comm_.rank() * s.chunk),
                                         param_.ptr(s.full_offset), s.chunk * wsize_));
  }
  return Status::Ok();
}

// Gathered and loading units hold the parameters as they were: gone before the update. The
// next step's first units start loading as soon as it is done.
Result<StepResult> ZeroEngine::step(double lr) {
  ZOE_RETURN_IF_ERROR(wait_update());
  ZOE_RETURN_IF_ERROR(unload_all());
  auto res = apply_step(lr);
  trace_.begin_step();
  if (res.ok()) prefetch_ahead();
  return res;
}

Result<StepResult> ZeroEngine::apply_step(double lr) {
  StepResult res;
  res.loss_scale = scaler_.scale();
  res.lr = lr;
  // Serves gradients other ranks still hand over, then every rank is at this step.
  if (plan_.shard_grads) ZOE_RETURN_IF_ERROR(sync_point(OpKind::kStep, -1, nullptr));
  if (Status st = finish_reductions(); !st.ok()) {
    drop_step_grads();
    return st;
  }
  if (require_matching_) ZOE_RETURN_IF_ERROR(check_matching_grads());
  double handed = 0;  // hand-overs on this rank since the last step
  for (int u = 0; u < num_units(); ++u) {
    const UnitSlot& s = layout_.slot(u);
    int seen = plan_.shard_grads ? reduced_[u] : local_seen_[u];
    handed += seen;
    if (seen == 0)  // a unit without gradient this step contributes zeros
      ZOE_RETURN_IF_ERROR(dev_.zero(grad_ptr(plan_.shard_grads ? s.shard_offset : s.full_offset),
                                    (plan_.shard_grads ? s.chunk : s.full_size) * gsize_));
    if (!plan_.shard_grads) ZOE_RETURN_IF_ERROR(reduce_unit_grad(u, grad_ptr(s.full_offset)));
  }
  drop_step_grads();  // counted; what they reduced stays for this step
  double sumsq = 0;
  {
    ZOE_SPAN("grad_norm", "compute", Bucket::kOptimizer);
    ZOE_ASSIGN_OR_RETURN(sumsq, owned_grad_sumsq(&handed));
  }
  // Adam on nothing would still move the weights (decay, momentum): a step no rank gave a
  // gradient to is a caller's mistake, and every rank knows it from the same sum.
  if (handed == 0)
    return Status::Runtime("step() before any gradient: no rank called grads_ready since the last step");
  // Gradients are sums over ranks and micro-steps of loss-scaled gradients: average and unscale.
  double inv = 1.0 / (res.loss_scale * comm_.size() * cfg_.grad_accum);
  bool overflow = !std::isfinite(sumsq);
  scaler_.update(overflow);
  res.step = steps_applied_;
  if (overflow) {
    res.grad_norm = sumsq;
    pending_ = res;
    pending_open_ = false;
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
  auto* sc = scalars_.as<StepScalars>();
  ZOE_RETURN_IF_ERROR(dev_.zero(&sc->nonfinite, sizeof(uint64_t)));
  host_nonfinite_ = 0;
  host_stepped_ = 0;
  res.applied = true;
  res.step = steps_applied_;
  pending_ = res;
  pending_open_ = true;
  start_update(lr, inv * coef);
  if (plan_.shard_params) return res;  // each fetch waits for its own unit's update
  // Replicated parameters are all-gathered from their owners: every rank needs the whole update.
  ZOE_ASSIGN_OR_RETURN(res, flush());
  ZOE_RETURN_IF_ERROR(gather_replicated_params());
  return res;
}

void ZeroEngine::start_update(double lr, double grad_scale) {
  progress_.start();
  update_thread_ = std::thread([this, lr, grad_scale] {
    Profiler::exclude_thread_from_buckets();  // the step's buckets count where it waits for this
    Profiler::name_thread("optimizer");
    progress_.finish(status_of_call("optimizer pass", [&] { return apply_adam(lr, grad_scale); }));
  });
}

Status ZeroEngine::wait_update() {
  if (update_thread_.joinable()) update_thread_.join();
  return progress_.wait_until(0);
}

// Unit u's optimizer range is updated once the pass is past its end.
Status ZeroEngine::wait_updated(int u) {
  if (!progress_.running()) return wait_update();
  ZOE_SPAN("wait update " + unit(u).name, "adam", Bucket::kWaitIo);
  return progress_.wait_until(opt_stop(u));
}

Result<StepResult> ZeroEngine::flush() {
  {
    ZOE_SPAN("wait update", "adam", Bucket::kOptimizer);
    ZOE_RETURN_IF_ERROR(wait_update());
  }
  if (pending_open_) {
    ZOE_RETURN_IF_ERROR(dev_.download(&pending_.nonfinite, &scalars_.as<StepScalars>()->nonfinite, sizeof(uint64_t)));
    pending_.nonfinite += host_nonfinite_;
    pending_.host_stepped = host_stepped_;
    pending_open_ = false;
  }
  prefetch_ahead();  // what waited for the update may start now
  return pending_;
}

// The low-precision weights are rewritten from the masters, piece by piece through host memory
// (the masters may live on NVMe).
Status ZeroEngine::commit_owned_state() {
  ZOE_RETURN_IF_ERROR(wait_update());
  drop_read_ahead();
  ZOE_RETURN_IF_ERROR(unload_all());
  if (cfg_.mixed_precision()) {
    std::vector<float> piece;
    for (int u = 0; u < num_units(); ++u)
      for (int64_t x = opt_begin(u); x < opt_end(u);) {
        int64_t k = std::min<int64_t>(opt_end(u) - x, int64_t{1} << 22);
        piece.resize(k);
        ZOE_RETURN_IF_ERROR(get_f32(master_, DType::kF32, opt_index(u, x), k, piece.data()));
        ZOE_RETURN_IF_ERROR(put_f32(param_, dtype_, param_index(u, x), k, piece.data()));
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

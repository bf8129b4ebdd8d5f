#include "sched/rank_state.h"

#include <algorithm>

#include <fmt/format.h>

#include "sched/memory_estimate.h"


namespace zoe {

RankState::RankState(const EngineOptions& c, Device& d, const ShardLayout& layout, StagePlan plan, int rank,
                     NvmeEnv* nvme_env)
    : cfg_(c), dev_(d), layout_(layout), plan_(plan), rank_(rank), env_(nvme_env), wsize_(dtype_size(c.dtype)),
      gdtype_(c.grad_dtype), gsize_(dtype_size(gdtype_)) {}

RankState::~RankState() {
  if (retirement_) {  // the uploads still reading pinned windows run first
    retirement_->drain();
    pool_->set_reclaimer(nullptr);
  }
  dev_.free(grad_);
  for (StateArray* a : {&param_, &master_, &exp_avg_, &exp_avg_sq_}) a->release(dev_);
  for (auto& st : stores_) (void)st->close();
  if (pool_registered_) dev_.unregister_host(pool_->base());
}

// What the pinned pool holds per element of a sub-group (memory_estimate.h's rule).
uint64_t RankState::pool_bytes_per_elem(uint64_t optimizer_bytes) const {
  bool param_nvme = cfg_.offload_param.device == OffloadDevice::kNvme;
  return pinned_pool_per_group(optimizer_bytes, param_nvme ? wsize_ : 0);
}

Status RankState::open_offload(const std::string& job, int64_t opt_elems, int64_t param_elems) {
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
  const PinnedPoolSize size = pinned_pool_size({static_cast<int>(paths.size()), bounce, per_elem, param_nvme ? wsize_ : 0, most, cfg_.sub_group_size,
                                                cfg_.host_memory_budget});
  const uint64_t pool_bytes = size.bytes;
  if (pool_bytes < size.io + 1024 * size.per_group)
    return Status::Invalid(fmt::format(
        "config key 'zoe.host_memory_budget': the NVMe tier's pinned pool (a quarter of it, {} bytes) cannot hold "
        "aio.queue_depth x aio.block_size = {} bytes of I/O buffers per store plus the optimizer's and the parameter loads' windows of 1024 elements",
        pool_bytes, bounce));
  bool pin = cfg_.offload_optimizer.pin_memory || cfg_.offload_param.pin_memory;
  ZOE_ASSIGN_OR_RETURN(pool_, PinnedPool::create({pool_bytes, pin, &dev_.ledger()}));
  // Adam and the copies read the windows in place: the device must reach the pool.
  ZOE_RETURN_IF_ERROR(dev_.register_host(pool_->base(), pool_->capacity()));
  pool_registered_ = true;  // (a failed registration leaves nothing to unregister)
  retirement_ = std::make_unique<WindowRetirement>(dev_);
  pool_->set_reclaimer([r = retirement_.get()](bool block) { return r->reclaim(block); });
  for (const std::string& path : paths) {
    NvmeStoreOptions o;
    o.nvme_path = path;
    o.job = job;
    o.rank = rank_;
    o.block_size = static_cast<uint32_t>(cfg_.aio_block_size);
    o.queue_depth = static_cast<unsigned>(cfg_.aio_queue_depth);
    o.checksums = cfg_.checksums;
    o.pool = pool_.get();
    o.pin_memory = pin;
    o.ledger = &dev_.ledger();
    o.env = env_;
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
  uint64_t fit = (pool_->available() - (uint64_t{1} << 20)) / std::max<uint64_t>(size.per_group, 1);
  group_elems_ = std::max<int64_t>(1024, std::min<int64_t>(cfg_.sub_group_size, static_cast<int64_t>(fit)));
  // Sub-groups and parameter windows that cut a unit do so on a block boundary of every array
  // (a block holds block/2 elements of a 2-byte array, block/4 of the fp32 ones): no block is
  // shared by two windows.
  const int64_t grain = cfg_.aio_block_size / 2;
  if (group_elems_ >= grain) group_elems_ = group_elems_ / grain * grain;
  return Status::Ok();
}

StateHome RankState::home(const OffloadConfig& o, const char* region) const {
  StateHome h;
  h.offload = o.device == OffloadDevice::kNone ? Tier::kDevice : o.device == OffloadDevice::kCpu ? Tier::kHost
                                                                                                  : Tier::kNvme;
  h.ratio = o.ratio;
  h.region = region;
  for (size_t i = 0; i < stores_.size(); ++i)
    if (o.device == OffloadDevice::kNvme && store_paths_[i] == o.nvme_path) h.store = stores_[i].get();
  return h;
}

Status RankState::allocate(const std::string& job) {
  const int64_t S = layout_.shard_size(), P = layout_.padded_params();
  const int64_t opt_elems = plan_.shard_optimizer ? S : P, param_elems = plan_.shard_params ? S : P;
  ZOE_RETURN_IF_ERROR(open_offload(job, opt_elems, param_elems));
  ZOE_RETURN_IF_ERROR(param_.allocate(dev_, home(cfg_.offload_param, "param"), param_elems, wsize_, Kind::kParam,
                                      unit_starts(/*optimizer=*/false)));
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
  return exp_avg_sq_.allocate(dev_, home(oo, "exp_avg_sq"), opt_elems, 4, Kind::kExpAvgSq, opt_units);
}

void RankState::wait_nvme_idle() {
  for (auto& store : stores_) store->wait_idle();
}

NvmeStore::Traffic RankState::nvme_traffic() const {
  NvmeStore::Traffic sum;
  for (const auto& store : stores_) {
    NvmeStore::Traffic t = store->traffic();
    sum.read_bytes += t.read_bytes;
    sum.written_bytes += t.written_bytes;
    sum.hashed_bytes += t.hashed_bytes;
    sum.forwarded_bytes += t.forwarded_bytes;
  }
  return sum;
}

std::vector<int64_t> RankState::unit_starts(bool optimizer) const {
  std::vector<int64_t> starts;
  for (int u = 0; u < layout_.num_units(); ++u) starts.push_back(optimizer ? opt_offset(u) : param_offset(u));
  return starts;
}

int64_t RankState::param_offset(int u) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_params ? s.shard_offset : s.full_offset;
}
int64_t RankState::grad_owned_offset(int u) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_grads ? s.shard_offset : s.full_offset + rank_ * s.chunk;
}
int64_t RankState::opt_offset(int u) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_optimizer ? s.shard_offset : s.full_offset;
}
int64_t RankState::opt_begin(int u) const { return plan_.shard_optimizer ? rank_ * layout_.slot(u).chunk : 0; }
int64_t RankState::opt_end(int u) const {
  return plan_.shard_optimizer ? opt_begin(u) + layout_.owned_real(u, rank_) : layout_.slot(u).numel;
}
int64_t RankState::param_index(int u, int64_t x) const {
  const UnitSlot& s = layout_.slot(u);
  return plan_.shard_params ? s.shard_offset + (x - rank_ * s.chunk) : s.full_offset + x;
}

// Memory parts take fp32 as a plain upload (or download) and convert other dtypes on the device
// through a staging buffer; NVMe parts convert on the host inside a pinned window, piece by
// piece.
Status RankState::put_f32(StateArray& a, DType dt, int64_t e, int64_t n, const float* src) {
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

Status RankState::get_f32(const StateArray& a, DType dt, int64_t e, int64_t n, float* dst) {
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

std::unique_ptr<ChunkLoad> RankState::chunk_load(int u, const Buffer& dst) {
  const UnitSlot& s = layout_.slot(u);
  return std::make_unique<ChunkLoad>(dev_, pool_.get(), param_, s.shard_offset, s.chunk, dst, rank_ * s.chunk * wsize_,
                                     group_elems_, retirement_.get());
}

}  // namespace zoe

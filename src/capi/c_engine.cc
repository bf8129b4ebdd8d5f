#include "capi/c_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "capi/dlpack_tensor.h"
#include "ckpt/atomic_file.h"
#include "ckpt/checkpoint.h"
#include "ckpt/params_from_file.h"
#include "ckpt/safetensors_writer.h"
#include "model/model.h"
#include "train/engine_options.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

namespace zoe::capi {

Result<std::unique_ptr<CEngine>> CEngine::create(const std::string& config_json) {
  ZOE_ASSIGN_OR_RETURN(Config c, parse_config(config_json, {}, "zoe_engine_new config"));
  ZOE_ASSIGN_OR_RETURN(std::unique_ptr<Comm> comm, make_comm());
  if (launched_by_mpirun()) {
    static bool registered = false;  // MPI is finalised once, at exit, whatever engines came and went
    if (!registered) registered = std::atexit(finalize_mpi) == 0;
  }
  ZOE_RETURN_IF_ERROR(validate_for_world(c, comm->size()));
  return std::unique_ptr<CEngine>(new CEngine(std::move(c), std::move(comm)));
}

// zoe_c.cc flushes first and reports the update's error; this flush only waits.
CEngine::~CEngine() {
  if (engine_) (void)engine_->flush();
  for (int u = 0; u < num_units(); ++u) drop_staged(u);
  engine_.reset();
  comm_->set_ledger(nullptr);
}

std::unique_lock<std::mutex> CEngine::lock() { return std::unique_lock<std::mutex>(mu_); }

Status CEngine::check_thread() const {
  if (std::this_thread::get_id() == owner_ || comm_->size() == 1 || mpi_serialized_calls()) return Status::Ok();
  return Status::Unsupported("a call from a thread other than the engine's creator, and this MPI library allows "
                             "MPI calls from one thread only (MPI_THREAD_SERIALIZED is not provided)");
}

int64_t CEngine::num_params() const {
  int64_t n = 0;
  for (const UnitSpec& u : units_) n += u.numel;
  return n;
}

int CEngine::unit_index(const std::string& s) const {
  if (auto it = unit_of_name_.find(s); it != unit_of_name_.end()) return it->second;
  if (auto it = params_.find(s); it != params_.end()) return it->second.unit;
  return -1;
}

Status CEngine::param_info(const std::string& name, int* unit, int64_t* offset, int64_t* numel) const {
  ZOE_ASSIGN_OR_RETURN(const ParamRef* p, find_param("zoe_param_info", name));
  const TensorSpec& t = units_[p->unit].tensors[p->tensor];
  if (unit) *unit = p->unit;
  if (offset) *offset = t.offset;
  if (numel) *numel = t.numel;
  return Status::Ok();
}

Status CEngine::need_started(const char* op) const {
  return engine_ ? Status::Ok() : Status::Runtime(fmt::format("{}: the engine is not started (call zoe_start)", op));
}

Status CEngine::check_unit(const char* op, int u) const {
  ZOE_RETURN_IF_ERROR(need_started(op));
  if (u < 0 || u >= num_units())
    return Status::Invalid(fmt::format("{}: unit {} does not exist (the engine has {} units)", op, u, num_units()));
  return Status::Ok();
}

Result<const CEngine::ParamRef*> CEngine::find_param(const char* op, const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) return Status::Invalid(fmt::format("{}: no parameter named '{}' is registered", op, name));
  return &it->second;
}

Status CEngine::register_param(const std::string& unit, const std::string& name, std::vector<int64_t> shape,
                               DLDataType dtype, bool decay) {
  const std::string what = fmt::format("zoe_register_param '{}'", name);
  if (engine_) return Status::Runtime(what + ": the engine is started; register every parameter before zoe_start");
  if (unit.empty() || name.empty()) return Status::Invalid(what + ": the unit and parameter names must not be empty");
  if (params_.count(name)) return Status::Invalid(what + ": a parameter of that name is already registered");
  ZOE_ASSIGN_OR_RETURN(DType dt, weight_dtype(dtype, what));
  if (dt != cfg_.dtype)
    return Status::Invalid(fmt::format("{}: dtype {} but the config trains in {} (bf16.enabled / fp16.enabled)", what,
                                       dl_dtype_name(dtype), dtype_name(cfg_.dtype)));
  for (int64_t d : shape)
    if (d <= 0)
      return Status::Invalid(fmt::format("{}: shape [{}] has a dimension <= 0", what, fmt::join(shape, ", ")));
  ZOE_ASSIGN_OR_RETURN(int64_t numel,
                       checked_numel(shape.data(), static_cast<int>(shape.size()), what, "parameter"));
  // The unit's and the model's counts stay within kMaxElements too (each is at most that: no overflow).
  auto known = unit_of_name_.find(unit);
  const int64_t unit_numel = known == unit_of_name_.end() ? 0 : units_[known->second].numel;
  if (unit_numel + numel > kMaxElements || num_params() + numel > kMaxElements)
    return Status::Invalid(fmt::format("{}: {} more elements would take unit '{}' ({}) or the model ({}) past {} "
                                       "elements (zoe's limit)", what, numel, unit, unit_numel, num_params(),
                                       kMaxElements));
  auto [it, added] = unit_of_name_.emplace(unit, num_units());
  if (added) units_.push_back(UnitSpec{unit, {}, 0});
  UnitSpec& us = units_[it->second];
  params_[name] = ParamRef{it->second, static_cast<int>(us.tensors.size())};
  us.tensors.push_back(TensorSpec{name, std::move(shape), us.numel, numel, decay});
  us.numel += numel;
  return Status::Ok();
}

Status CEngine::start() {
  if (engine_) return Status::Runtime("zoe_start: the engine is started already");
  if (units_.empty()) return Status::Invalid("zoe_start: no parameter is registered");
  ZOE_RETURN_IF_ERROR(resolve_device_budget(cfg_, *comm_));
  ZOE_ASSIGN_OR_RETURN(backend_, make_backend(cfg_, *comm_));
  comm_->set_ledger(&backend_.device->ledger());
  ZOE_ASSIGN_OR_RETURN(engine_, ZeroEngine::create(engine_options(cfg_), *backend_.device, tensor_comm(), units_));
  engine_->require_matching_grads(true);  // a unit forgotten on one rank is an error at zoe_step
  state_.assign(units_.size(), UnitState{});
  return Status::Ok();
}

Status CEngine::set_param(const std::string& name, const DLTensor* value) {
  const std::string what = fmt::format("zoe_set_param '{}'", name);
  ZOE_RETURN_IF_ERROR(need_started("zoe_set_param"));
  ZOE_ASSIGN_OR_RETURN(const ParamRef* p, find_param("zoe_set_param", name));
  const TensorSpec& t = units_[p->unit].tensors[p->tensor];
  ZOE_RETURN_IF_ERROR(check_tensor(value, t.shape, t.numel, what, "value"));
  if (value->device.device_type != kDLCPU) return Status::Invalid(what + ": initial values must be in host memory");
  UnitState& s = state_[p->unit];
  const UnitSpec& us = units_[p->unit];
  if (s.init.empty()) {
    s.init.assign(us.numel, 0.0f);
    s.init_set.assign(us.tensors.size(), 0);
  }
  read_host_f32(*value, s.init.data() + t.offset);
  s.init_set[p->tensor] = 1;
  for (char set : s.init_set)
    if (!set) return Status::Ok();
  // Rank 0's values count (a framework seeded differently per rank still starts as one model).
  Status st = comm_->broadcast(s.init.data(), s.init.size() * sizeof(float), 0);
  if (st.ok()) st = engine_->set_params(p->unit, s.init.data());
  s.init = {};
  s.init_set = {};
  return st;
}

Status CEngine::load_safetensors(const std::string& path) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_load_safetensors"));
  return init_params_from_file(*engine_, path, "", "zoe_load_safetensors");
}

Result<DLDevice> CEngine::device() const {
  ZOE_RETURN_IF_ERROR(need_started("zoe_device"));
  return dl_device();
}

DLDevice CEngine::dl_device() const {
  if (!backend_.device) return {kDLCPU, 0};
  const Device::Place p = backend_.device->place();
  return p.gpu ? DLDevice{kDLCUDA, p.index} : DLDevice{kDLCPU, 0};
}

namespace {

// A DLManagedTensor that owns its shape array; the memory it points at is the engine's.
struct ViewTensor {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
};

void delete_view(DLManagedTensor* t) { delete static_cast<ViewTensor*>(t->manager_ctx); }

}  // namespace

Result<DLManagedTensor*> CEngine::fetch(int u) {
  ZOE_RETURN_IF_ERROR(check_unit("zoe_fetch", u));
  if (cfg_.device == "cpu-strict")
    return Status::Unsupported("zoe_fetch: the 'cpu-strict' device's memory is closed to host code; use "
                               "zoe.device \"cpu\" to hand parameters to another framework");
  ZOE_ASSIGN_OR_RETURN(ParamView v, engine_->fetch(u));
  // The gather is ordered on zoe's streams; the caller reads on its own (a torch stream), so the
  // memory is handed out only once it holds the parameters, or once that stream waits for them.
  Status ready = ready_for_caller();
  if (!ready.ok()) {
    (void)engine_->release(u);
    return ready;
  }
  ++state_[u].fetched;
  auto* t = new ViewTensor;
  t->shape[0] = v.numel;
  DLTensor& d = t->managed.dl_tensor;
  d.data = const_cast<void*>(v.data);
  d.device = dl_device();
  d.ndim = 1;
  d.dtype = dl_dtype(v.dtype);
  d.shape = t->shape;
  d.strides = nullptr;
  d.byte_offset = 0;
  t->managed.manager_ctx = t;
  t->managed.deleter = delete_view;
  return &t->managed;
}

Status CEngine::wait_stream(void* stream) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_wait_stream"));
  return backend_.device->wait_external(stream);
}

Status CEngine::set_stream(void* stream) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_set_stream"));
  caller_stream_ = stream;
  return Status::Ok();
}

Status CEngine::ready_for_caller() {
  Device& dev = *backend_.device;
  const Event done = dev.record(Stream::kCompute);
  return caller_stream_ ? dev.external_wait_on(*caller_stream_, done) : dev.wait(done);
}

Status CEngine::release(int u) {
  ZOE_RETURN_IF_ERROR(check_unit("zoe_release", u));
  if (state_[u].fetched == 0)
    return Status::Runtime(fmt::format("zoe_release: unit '{}' is not fetched", units_[u].name));
  ZOE_RETURN_IF_ERROR(engine_->release(u));
  --state_[u].fetched;
  return Status::Ok();
}

Status CEngine::put_grad(const DLTensor& g, float* dst, int64_t n, const std::string& what) {
  Device& dev = *backend_.device;
  if (g.device.device_type == kDLCPU) {
    const char* base = static_cast<const char*>(g.data) + g.byte_offset;
    if (dl_compact(g) && g.dtype.code == kDLFloat && g.dtype.bits == 32)  // torch's usual: no host copy
      return dev.upload(dst, base, n * sizeof(float));
    std::vector<float> host(n);
    read_host_f32(g, host.data());
    return dev.upload(dst, host.data(), n * sizeof(float));
  }
  if (g.device.device_type != dl_device().device_type || g.device.device_id != dl_device().device_id)
    return Status::Invalid(fmt::format("{}: the gradient is on device type {} id {}, not in host memory or on this "
                                       "engine's device", what, static_cast<int>(g.device.device_type),
                                       g.device.device_id));
  if (!dl_compact(g) || g.dtype.bits == 64)
    return Status::Unsupported(what + ": a gradient in GPU memory must be compact float32/bfloat16/float16");
  ZOE_ASSIGN_OR_RETURN(DType dt, weight_dtype(g.dtype, what));
  ZOE_RETURN_IF_ERROR(dev.accumulate(dst, DType::kF32, static_cast<const char*>(g.data) + g.byte_offset, dt, n, false));
  // The copy is queued on zoe's stream, and the caller may free the gradient as soon as this
  // returns (torch's allocator then hands its memory to the next kernel on torch's stream): that
  // stream waits for the copy's read, or the call returns once it is done.
  return ready_for_caller();
}

Status CEngine::grad_param(const std::string& name, const DLTensor* grad) {
  const std::string what = fmt::format("zoe_grad_param '{}'", name);
  ZOE_RETURN_IF_ERROR(need_started("zoe_grad_param"));
  ZOE_ASSIGN_OR_RETURN(const ParamRef* p, find_param("zoe_grad_param", name));
  const TensorSpec& t = units_[p->unit].tensors[p->tensor];
  ZOE_RETURN_IF_ERROR(check_tensor(grad, t.shape, t.numel, what, "gradient"));
  UnitState& s = state_[p->unit];
  if (!s.grad) {
    ZOE_ASSIGN_OR_RETURN(s.grad, backend_.device->alloc(units_[p->unit].numel * sizeof(float), Tier::kDevice,
                                                        Kind::kStaging));
    s.grad_set.assign(units_[p->unit].tensors.size(), 0);
  }
  ZOE_RETURN_IF_ERROR(put_grad(*grad, s.grad.as<float>() + t.offset, t.numel, what));
  s.grad_set[p->tensor] = 1;
  return Status::Ok();
}

Status CEngine::grads_ready(int u, const DLTensor* grad) {
  ZOE_RETURN_IF_ERROR(check_unit("zoe_grads_ready", u));
  const UnitSpec& us = units_[u];
  UnitState& s = state_[u];
  const std::string what = fmt::format("zoe_grads_ready '{}'", us.name);
  if (grad) {  // the whole unit at once
    if (s.grad) return Status::Runtime(what + ": gradients of this unit are staged by zoe_grad_param already");
    ZOE_RETURN_IF_ERROR(check_tensor(grad, {}, us.numel, what, "gradient"));
    ZOE_ASSIGN_OR_RETURN(Buffer b, backend_.device->alloc(us.numel * sizeof(float), Tier::kDevice, Kind::kStaging));
    Status st = put_grad(*grad, b.as<float>(), us.numel, what);
    if (st.ok()) st = engine_->grads_ready(u, b.as<float>());
    backend_.device->free(b);
    return st;
  }
  if (!s.grad) return Status::Runtime(what + ": no gradient is staged (zoe_grad_param) and none is given");
  for (size_t i = 0; i < us.tensors.size(); ++i)  // a parameter without a gradient counts as zeros
    if (!s.grad_set[i])
      ZOE_RETURN_IF_ERROR(backend_.device->zero(s.grad.as<float>() + us.tensors[i].offset,
                                                us.tensors[i].numel * sizeof(float)));
  Status st = engine_->grads_ready(u, s.grad.as<float>());
  drop_staged(u);
  return st;
}

void CEngine::drop_staged(int u) {
  if (u < static_cast<int>(state_.size()) && state_[u].grad) {
    backend_.device->free(state_[u].grad);
    state_[u].grad_set = {};
  }
}

Status CEngine::check_none_held(const char* op) const {
  std::vector<std::string> held;
  for (int u = 0; u < num_units(); ++u)
    if (state_[u].fetched > 0) held.push_back(fmt::format("{} ('{}')", u, units_[u].name));
  if (held.empty()) return Status::Ok();
  if (held.size() == 1)
    return Status::Runtime(fmt::format("{}: unit {} is still held (fetched and not released); release it before "
                                       "stepping", op, held[0]));
  const size_t shown = std::min<size_t>(held.size(), 8);
  return Status::Runtime(fmt::format("{}: {} units are still held (fetched and not released): {}{}; release them "
                                     "before stepping", op, held.size(),
                                     fmt::join(held.begin(), held.begin() + shown, ", "),
                                     shown < held.size() ? ", ..." : ""));
}

Result<double> CEngine::step_lr(const char* op, double lr) const {
  if (std::isfinite(lr) && lr < 0) return lr_at(cfg_, engine_->steps_applied());
  ZOE_RETURN_IF_ERROR(check_learning_rate(lr, fmt::format("{}: lr", op)));
  return lr;
}

Result<StepResult> CEngine::step(double lr) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_step"));
  // Refused before the step's first collective: this rank has not joined the step, and other
  // ranks wait in theirs until it calls zoe_step again. (No agreement here: at stages 2-3 the
  // engine's own protocol must be the first to speak, as it serves hand-overs still in flight.)
  ZOE_RETURN_IF_ERROR(check_none_held("zoe_step"));
  ZOE_ASSIGN_OR_RETURN(double checked_lr, step_lr("zoe_step", lr));
  // Staged gradients not yet handed over go now, in unit order (other ranks' differing sets are
  // matched by the engine with zeros, as for any unit a rank has no gradient for).
  for (int u = 0; u < num_units(); ++u)
    if (state_[u].grad) ZOE_RETURN_IF_ERROR(grads_ready(u, nullptr));
  return engine_->step(checked_lr);  // stage 3's update runs on, overlapped with the next forward
}

Status CEngine::set_activation_bytes(uint64_t bytes) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_set_activation_bytes"));
  engine_->set_activation_bytes(bytes);
  return Status::Ok();
}

Status CEngine::update_during_backward(double lr) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_update_during_backward"));
  ZOE_ASSIGN_OR_RETURN(double checked_lr, step_lr("zoe_update_during_backward", lr));  // as step() will pick it
  return engine_->update_during_backward(checked_lr);
}

Status CEngine::flush() { return engine_ ? engine_->flush().status() : Status::Ok(); }

Status CEngine::save(const std::string& dir) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_save"));
  if (dir.empty()) return Status::Invalid("zoe_save: the directory is empty");
  ZOE_RETURN_IF_ERROR(lock_checkpoint_root(dir));
  TrainState st;
  st.steps_done = st.steps_applied = engine_->steps_applied();
  st.loss_scale = engine_->loss_scale();
  engine_->scaler_state(&st.scaler_good_steps, &st.scaler_hysteresis);
  return save_checkpoint(dir, *engine_, *comm_, config_to_json(cfg_), cfg_.stage, st, cfg_.checkpoint_keep).status();
}

// Saving prunes the root and clears killed saves' temporary directories: a second job saving
// there would delete this one's. Rank 0 locks a root at its first save and keeps it.
Status CEngine::lock_checkpoint_root(const std::string& dir) {
  if (dir == locked_root_) return Status::Ok();
  // A root saved to before is free again once the new one is held.
  ZOE_ASSIGN_OR_RETURN(root_lock_, CheckpointRootLock::AcquireOnRankZero(dir, "zoe_save", *comm_));
  locked_root_ = dir;
  return Status::Ok();
}

Status CEngine::load(const std::string& path) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_load"));
  std::string ckpt = path;
  if (!std::filesystem::exists(std::filesystem::path(path) / "manifest.json")) {
    ZOE_ASSIGN_OR_RETURN(ckpt, agree_latest_checkpoint(path, *comm_));  // rank 0's choice, on every rank
    if (ckpt.empty()) return Status::Invalid(fmt::format("zoe_load: '{}' holds no complete checkpoint", path));
  }
  TrainState st;
  ZOE_RETURN_IF_ERROR(load_checkpoint(ckpt, *engine_, *comm_, cfg_.checkpoint_verify, &st));  // zoe.checksums: swap only
  engine_->restore_counters(st.steps_applied, st.loss_scale, st.scaler_good_steps, st.scaler_hysteresis);
  return Status::Ok();
}

// Unit by unit: gathered (collective) and converted to fp32 on every rank; rank 0 keeps them until
// the file is written.
// Rank 0 streams each unit's tensors into the file as that unit is fetched, so one unit's fp32
// copy is in memory at a time, not the model's (the consolidation that runs DeepSpeed users out
// of memory); the other ranks fetch the same units in the same order, a fetch being collective at
// stage 3. A write that fails on rank 0 (a refused path, a full disk) leaves it fetching the units
// left, so that no rank waits on a fetch another never makes. The file carries safetensors'
// {"format": "pt"} metadata, which transformers' from_pretrained requires.
Status CEngine::export_weights(const std::string& path) {
  ZOE_RETURN_IF_ERROR(need_started("zoe_export"));
  std::vector<float> unit;  // the values of unit fetched - 1
  int fetched = 0;          // units fetched so far, in unit order
  Status fetch_failed;
  auto fetch_through = [&](int u) -> Status {  // fetches units [fetched, u]
    for (; fetched <= u; ++fetched) {
      unit.assign(units_[fetched].numel, 0.0f);
      fetch_failed = fetch_to_host(*engine_, fetched, unit.data());
      ZOE_RETURN_IF_ERROR(fetch_failed);
    }
    return Status::Ok();
  };
  Status st = Status::Ok();
  if (rank() == 0) {
    SafetensorsWriter w;
    for (int u = 0; u < num_units() && st.ok(); ++u)
      for (const TensorSpec& t : units_[u].tensors)
        if (st.ok())
          st = w.add_streamed(t.name, DType::kF32, t.shape, [&, u](AtomicFile& f) {
            ZOE_RETURN_IF_ERROR(fetch_through(u));
            return f.append(unit.data() + t.offset, size_t(t.numel) * 4);
          });
    w.set_metadata("format", "pt");
    if (st.ok()) st = w.write(path);
  }
  if (!fetch_failed.ok()) return fetch_failed;  // the engine's own error: as a failed fetch always was
  ZOE_RETURN_IF_ERROR(fetch_through(num_units() - 1));
  return agree(*comm_, st, Status::Io("zoe_export: rank 0 could not write the file"));
}

std::string CEngine::stats_json() const {
  nlohmann::json j = {{"rank", rank()}, {"world_size", world()}, {"started", started()}, {"params", num_params()},
                      {"units", num_units()}};
  if (!engine_) return j.dump();
  LedgerSnapshot l = backend_.device->ledger().snapshot();
  nlohmann::json ledger;
  for (int t = 0; t < kNumTiers; ++t) {
    nlohmann::json tier;
    for (int k = 0; k < kNumKinds; ++k) tier[std::string(kind_name(static_cast<Kind>(k)))] = l.bytes[t][k];
    tier["persistent"] = l.persistent(static_cast<Tier>(t));
    tier["peak"] = l.peak[t];
    ledger[std::string(tier_name(static_cast<Tier>(t)))] = tier;
  }
  const CommBytes& c = backend_.tensor_comm ? backend_.tensor_comm->bytes_sent() : comm_->bytes_sent();
  j["ledger"] = ledger;
  j["budgets"] = {{"device", cfg_.device_memory_budget}, {"host", cfg_.host_memory_budget}};
  j["comm_bytes"] = {{"all_gather", c.all_gather}, {"reduce_scatter", c.reduce_scatter},
                     {"all_reduce", c.all_reduce}, {"broadcast", c.broadcast}};
  j["steps_applied"] = engine_->steps_applied();
  j["loss_scale"] = engine_->loss_scale();
  return j.dump();
}

}  // namespace zoe::capi

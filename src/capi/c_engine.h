// The engine behind the C API (include/zoe/zoe.h): a parameter registry in front of Engine, DLPack
// in and out, gradient staging per unit, and the checks a foreign caller needs (order of calls,
// threads). Every method returns a Status; zoe_c.cc turns those into codes and messages.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <dlpack/dlpack.h>

#include "ckpt/root_lock.h"
#include "comm/comm.h"
#include "common/config.h"
#include "sched/zero_engine.h"
#include "train/backend.h"
#include "zoe/engine.h"

namespace zoe::capi {

class CEngine {
 public:
  static Result<std::unique_ptr<CEngine>> create(const std::string& config_json);
  ~CEngine();

  // Held by zoe_c.cc around every call: one call at a time, from a thread MPI allows.
  std::unique_lock<std::mutex> lock();
  Status check_thread() const;

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }
  bool started() const { return engine_ != nullptr; }
  int num_units() const { return static_cast<int>(units_.size()); }
  int64_t num_params() const;
  int unit_index(const std::string& unit_or_param) const;
  Status param_info(const std::string& name, int* unit, int64_t* offset, int64_t* numel) const;

  Status register_param(const std::string& unit, const std::string& name, std::vector<int64_t> shape,
                        DLDataType dtype, bool decay);
  Status start();

  Status set_param(const std::string& name, const DLTensor* value);
  Status load_safetensors(const std::string& path);
  Result<DLManagedTensor*> fetch(int u);
  Result<DLDevice> device() const;
  Status release(int u);
  Status wait_stream(void* stream);
  // The caller's stream (nullptr: CUDA's default stream) that reads what fetch() returns and
  // writes the gradients grad_param / grads_ready read; until set, those calls wait on the host.
  Status set_stream(void* stream);
  Status grad_param(const std::string& name, const DLTensor* grad);
  Status grads_ready(int u, const DLTensor* grad);
  Result<StepResult> step(double lr);
  Status set_activation_bytes(uint64_t bytes);  // Engine::set_activation_bytes
  Status update_during_backward(double lr);  // zoe.update_in_backward (Engine::update_during_backward)
  // Waits for the last step's update (stage 3 runs it on after zoe_step returns) and returns its
  // error: zoe_engine_close reports it, zoe_engine_free logs it.
  Status flush();
  double loss_scale() const { return engine_ ? engine_->loss_scale() : 1.0; }

  Status save(const std::string& dir);
  Status load(const std::string& path);
  Status export_weights(const std::string& path);
  std::string stats_json() const;

 private:
  struct ParamRef {
    int unit = 0, tensor = 0;
  };
  // Per unit: initial values until all its tensors are set, and this micro-step's staged gradient.
  struct UnitState {
    int fetched = 0;                 // zoe_fetch minus zoe_release
    std::vector<float> init;
    std::vector<char> init_set;
    Buffer grad;                     // device memory, numel fp32, while anything is staged
    std::vector<char> grad_set;
  };

  CEngine(Config c, std::unique_ptr<Comm> comm) : cfg_(std::move(c)), comm_(std::move(comm)) {}
  Status need_started(const char* op) const;
  // Ok when no unit is fetched and not released: a step would update the weights under the
  // caller's view of them, which would keep the old ones.
  Status check_none_held(const char* op) const;
  // lr < 0 (finite): the config's optimizer/scheduler value for the next step; any other lr must
  // pass the config's own check (check_learning_rate).
  Result<double> step_lr(const char* op, double lr) const;
  Status check_unit(const char* op, int u) const;
  Result<const ParamRef*> find_param(const char* op, const std::string& name) const;
  Comm& tensor_comm() { return backend_.tensor_comm ? *backend_.tensor_comm : *comm_; }
  DLDevice dl_device() const;
  // grad (checked) -> fp32 in device memory at dst: host memory is converted and uploaded;
  // device memory (a GPU engine) is converted there, when compact.
  Status put_grad(const DLTensor& grad, float* dst, int64_t n, const std::string& what);
  Status hand_over(int u, const float* device_grad);
  // What fetch and the gradients' reads hand back to the caller: with its stream set, that stream
  // waits for zoe's work so far (an event); else the host does.
  Status ready_for_caller();
  void drop_staged(int u);
  Status lock_checkpoint_root(const std::string& dir);

  Config cfg_;
  std::unique_ptr<Comm> comm_;
  Backend backend_;
  std::unique_ptr<ZeroEngine> engine_;
  std::vector<UnitSpec> units_;
  std::vector<UnitState> state_;
  std::map<std::string, int> unit_of_name_;
  std::map<std::string, ParamRef> params_;
  std::mutex mu_;
  std::thread::id owner_ = std::this_thread::get_id();
  std::optional<void*> caller_stream_;  // set_stream's
  // Rank 0 holds the root zoe_save last wrote to, until the engine goes (CheckpointRootLock).
  std::optional<CheckpointRootLock> root_lock_;
  std::string locked_root_;
};

}  // namespace zoe::capi

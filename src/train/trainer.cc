#include "train/trainer.h"

#include <unistd.h>

#include <cblas.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/params_from_file.h"
#include "ckpt/root_lock.h"
#include "ckpt/safetensors_reader.h"
#include "common/profiler.h"
#include "kernels/gemm.h"
#include "model/gpt2_model.h"
#include "ops/model_ops.h"
#include "model/mlp_model.h"
#include "train/backend.h"
#include "sched/zero_engine.h"
#include "train/batch_source.h"
#include "train/engine_options.h"
#include "train/lr_schedule.h"
#include "train/progress.h"
#include "train/step_report.h"
#include "train/trace_writer.h"
#include "zoe/engine.h"

namespace zoe {

Status validate_for_world(const Config& c, int world) {
  int64_t global = int64_t{c.micro_batch} * c.grad_accum * world;
  if (c.train_batch && *c.train_batch != global)
    return Status::Invalid(fmt::format(
        "config key 'train_batch_size': {} != train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x "
        "world size {} = {} (mpirun -np does not match the config)",
        *c.train_batch, c.micro_batch, c.grad_accum, world, global));
  if (c.offload_param.device != OffloadDevice::kNone && c.stage < 3)
    return Status::Invalid(fmt::format(
        "config key 'zero_optimization.offload_param.device': offloading parameters needs stage 3 (stage is {})",
        c.stage));
  if (c.grad_accum_dtype == DType::kF16 && c.dtype == DType::kBF16)
    return Status::Invalid("config key 'data_types.grad_accum_dtype': \"fp16\" gradients with bf16 weights would "
                           "overflow without a loss scale; use \"fp32\" or \"bf16\"");
  return Status::Ok();
}

// zoe.compute_dtype "auto": bf16 products in bf16 training where they run on bf16 units (the
// CPU's oneDNN path, kernels/gemm.h), else fp32. Not yet on CUDA: its bf16 products are written
// but have not run on a GPU.
std::string resolve_compute_dtype(const Config& c) {
  if (c.compute_dtype != "auto") return c.compute_dtype;
  if (c.dtype != DType::kBF16 || c.model_type != "gpt2" || c.device == "cuda") return "fp32";
  auto p = gemm_path(GemmType::kBF16);
  return p.ok() && *p == GemmPath::kOneDnn ? "bf16" : "fp32";
}

namespace {

Result<std::unique_ptr<Model>> make_model(const Config& c) {
  if (c.model_type == "mlp") return std::unique_ptr<Model>(new MlpModel(c.n_layer, c.n_embd, c.seed + 1));
  gpt2::Gpt2Shape s{c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.n_positions};
  Status ok = gpt2::validate_shape(s);
  if (!ok.ok()) return Status::Invalid("config key 'zoe.model': " + ok.message());
  return std::unique_ptr<Model>(new Gpt2Model(s, c.activation_checkpointing, c.compute_dtype == "bf16"));
}

// The device's ops can run this job: their setup succeeded (a CUDA device's cuBLASLt handle and
// workspace, taken from the device budget before the engine's state), and the model's shapes are
// ones its kernels run (exit 2 before any step, not an op that fails mid-training).
Status check_device_ops(const Config& c, ModelOps& ops) {
  if (Status s = ops.status(); !s.ok())
    return Status::Runtime("zoe.device \"" + c.device + "\": its compute ops failed to start: " + s.message());
  const Status s = ops.supports_attention(c.micro_batch, c.seq_len, c.n_embd, c.n_head);
  if (s.ok()) return s;
  return Status::Invalid(
      "config keys 'zoe.model.n_embd', 'zoe.model.n_head' and 'train_micro_batch_size_per_gpu' (head size " +
      std::to_string(c.n_embd / std::max(c.n_head, 1)) + ", " + std::to_string(c.micro_batch) + " x " +
      std::to_string(c.n_head) + " heads): zoe.device \"" + c.device + "\" cannot run this attention: " + s.message());
}

// Micro-batches per rank in one validation pass.
constexpr int kValBatches = 4;

Result<std::unique_ptr<BatchSource>> make_source(const Config& c, const std::string& path, int rank, int world,
                                                 bool val) {
  if (c.model_type == "mlp")  // validation samples start far past anything training reaches
    return make_synthetic_source(c.micro_batch, rank, world, val ? int64_t{1} << 50 : 0);
  return make_token_source(path, c.data_format, c.vocab_size, c.micro_batch, c.seq_len, rank, world);
}

class TrainJob {
 public:
  TrainJob(const Config& c, Comm& comm, const TrainOptions& o) : c_(c), comm_(comm), o_(o) {}
  ~TrainJob() { comm_.set_ledger(nullptr); }  // the device's ledger goes away with the job

  Result<TrainSummary> run() {
    ZOE_RETURN_IF_ERROR(setup());
    TrainSummary sum;
    sum.final_loss = state_.last_loss;
    sum.steps = state_.steps_done;
    Progress progress(c_.steps, comm_.rank() == 0 && !o_.quiet, c_.steps_per_print);
    for (int64_t s = state_.steps_done; s < c_.steps; ++s) {
      ZOE_ASSIGN_OR_RETURN(double loss, one_step(s, progress));
      sum.final_loss = loss;
      sum.steps = s + 1;
      bool last = s + 1 == c_.steps, due = c_.checkpoint_every > 0 && (s + 1) % c_.checkpoint_every == 0;
      if (!c_.checkpoint_dir.empty() && (due || last)) {
        ZOE_ASSIGN_OR_RETURN(sum.checkpoint, save());
      }
    }
    progress.finish();
    // Stage 3's last update runs behind the loop: the job is done only once it has succeeded.
    ZOE_RETURN_IF_ERROR(engine_->flush().status());
    // What the NVMe tier moved after the last step's line (its write-backs, the last save's
    // reads), once all of it has completed: the lines then add up to the stores' whole traffic.
    engine_->wait_nvme_idle();
    RankStepFacts mine{};
    Engine::NvmeBytes rest = nvme_since_last();
    mine.nvme_read = rest.read, mine.nvme_written = rest.written;
    ZOE_ASSIGN_OR_RETURN(auto facts, gather_facts(comm_, mine));
    ZOE_RETURN_IF_ERROR(report_.write({{"done", true}, {"final_loss", sum.final_loss},
                                       {"checkpoint", sum.checkpoint.empty() ? nlohmann::json() : nlohmann::json(sum.checkpoint)},
                                       {"nvme_bytes", nvme_json(facts)}, {"compute_dtype", c_.compute_dtype}}));
    if (!o_.trace_path.empty()) ZOE_RETURN_IF_ERROR(write_trace(comm_, o_.trace_path));
    return sum;
  }

 private:
  // Ranks on one machine share its cores: each takes its share, so oneTBB and OpenBLAS do not
  // oversubscribe them (OMPI sets the local rank count). GPT-2's GEMMs run in oneTBB's slices,
  // OpenBLAS single-threaded inside them; the OpenBLAS limit is for the test MLP's. OpenBLAS's
  // count is only lowered: a smaller OPENBLAS_NUM_THREADS stays, and raising it would start
  // workers that spin ~0.1 s of CPU on a GPU job, which makes no OpenBLAS product.
  void limit_threads() {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
    int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks_here);
    threads_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, threads);
    if (openblas_get_num_threads() > threads) openblas_set_num_threads(threads);
  }

  Status setup() {
    Profiler::name_thread("main");  // the model's compute and every wait of the step
    ZOE_RETURN_IF_ERROR(validate_for_world(c_, comm_.size()));
    limit_threads();
    std::string resume;
    if (!c_.checkpoint_dir.empty()) {
      ZOE_RETURN_IF_ERROR(lock_checkpoint_root());
      // Rank 0's choice on every rank: ranks listing a shared file system with stale metadata
      // could otherwise load different steps, or one find none.
      std::vector<std::string> skipped;
      ZOE_ASSIGN_OR_RETURN(resume, agree_latest_checkpoint(c_.checkpoint_dir, comm_, &skipped));
      for (const std::string& w : skipped) std::fprintf(stderr, "zoe: warning: %s\n", w.c_str());
    }
    // Output files are checked before any work, on rank 0, and the outcome shared: a bad path is
    // found in the first second, not after the run. A resumed run appends to its report.
    Status opened = Status::Ok();
    if (comm_.rank() == 0) {
      opened = report_.open(o_.report_path, /*append=*/!resume.empty());
      if (opened.ok()) opened = check_trace_path(o_.trace_path);
    }
    ZOE_RETURN_IF_ERROR(agree(comm_, opened, Status::Invalid("rank 0 cannot write its output files")));
    Profiler::get().enable_trace(!o_.trace_path.empty());
    ZOE_RETURN_IF_ERROR(resolve_device_budget(c_, comm_));
    ZOE_ASSIGN_OR_RETURN(Backend backend, make_backend(c_, comm_));
    dev_ = std::move(backend.device);
    tensor_comm_ = std::move(backend.tensor_comm);
    comm_.set_ledger(&dev_->ledger());
    c_.compute_dtype = resolve_compute_dtype(c_);  // the report's done line says what ran
    ZOE_ASSIGN_OR_RETURN(model_, make_model(c_));
    if (model_->uses_device_ops()) ZOE_RETURN_IF_ERROR(check_device_ops(c_, dev_->ops()));
    ZOE_ASSIGN_OR_RETURN(engine_, ZeroEngine::create(engine_options(c_), *dev_, tensor(), model_->units(), o_.nvme_env));
    ZOE_ASSIGN_OR_RETURN(source_, make_source(c_, c_.data_train, comm_.rank(), comm_.size(), false));
    if (c_.eval_every > 0) {
      if (c_.model_type == "gpt2" && c_.data_val.empty())
        return Status::Invalid("config key 'zoe.data.val': required when zoe.eval_every > 0");
      ZOE_ASSIGN_OR_RETURN(val_, make_source(c_, c_.data_val, comm_.rank(), comm_.size(), true));
    }
    if (!resume.empty()) {
      ZOE_RETURN_IF_ERROR(load_checkpoint(resume, *engine_, comm_, c_.checkpoint_verify, &state_));
      engine_->restore_counters(state_.steps_applied, state_.loss_scale, state_.scaler_good_steps,
                               state_.scaler_hysteresis);
      ZOE_RETURN_IF_ERROR(source_->seek({state_.data_shard, state_.data_position}));
      if (comm_.rank() == 0 && !o_.quiet) fmt::print("resuming from {} (step {})\n", resume, state_.steps_done);
      return Status::Ok();
    }
    return c_.init_path.empty() ? init_default() : init_from_file(c_.init_path);
  }

  // Rank 0 writes and prunes checkpoints, so it holds the root for the job's life: a second job
  // on it would delete this one's saves in progress and prune its checkpoints.
  Status lock_checkpoint_root() {
    ZOE_ASSIGN_OR_RETURN(root_lock_, CheckpointRootLock::AcquireOnRankZero(c_.checkpoint_dir,
                                                                          "config key 'zoe.checkpoint.dir'", comm_));
    return Status::Ok();
  }

  Status init_default() { return init_params(*engine_, *model_, c_.seed); }

  // Starts from a safetensors file with the model's tensor names (a "transformer." prefix is
  // accepted, as in Hugging Face GPT-2 files). Every tensor must be present with its shape.
  Status init_from_file(const std::string& path) {
    return init_params_from_file(*engine_, path, "transformer.", "config key 'zoe.init'");
  }

  Result<std::string> save() {
    state_.steps_applied = engine_->steps_applied();
    state_.loss_scale = engine_->loss_scale();
    engine_->scaler_state(&state_.scaler_good_steps, &state_.scaler_hysteresis);
    state_.data_shard = source_->position().shard;
    state_.data_position = source_->position().offset;
    return save_checkpoint(c_.checkpoint_dir, *engine_, comm_, config_to_json(c_), c_.stage, state_, c_.checkpoint_keep);
  }

  // Mean loss over kValBatches micro-batches per rank, always the same ones.
  Result<double> validate() {
    ZOE_RETURN_IF_ERROR(val_->seek({}));
    double sum = 0;
    for (int i = 0; i < kValBatches; ++i) {
      ZOE_ASSIGN_OR_RETURN(Batch b, val_->next());
      ZOE_ASSIGN_OR_RETURN(double l, model_->eval_loss(*engine_, b));
      sum += l;
    }
    ZOE_RETURN_IF_ERROR(comm_.all_reduce_sum(&sum, 1));
    return sum / (kValBatches * comm_.size());
  }

  // The NVMe tier's bytes since the previous call (the report's per-line figure).
  Engine::NvmeBytes nvme_since_last() {
    Engine::NvmeBytes now = engine_->nvme_bytes();
    Engine::NvmeBytes d{now.read - nvme_seen_.read, now.written - nvme_seen_.written};
    nvme_seen_ = now;
    return d;
  }

  Result<double> one_step(int64_t s, Progress& progress) {
    auto t0 = std::chrono::steady_clock::now();
    tensor().reset_counters();
    dev_->ledger().reset_peaks();
    Profiler::get().take_step_times();
    double local[2] = {0, 0};  // loss sum, tokens
    const double lr = lr_at(c_, engine_->steps_applied());
    for (int m = 0; m < c_.grad_accum; ++m) {
      ZOE_ASSIGN_OR_RETURN(Batch b, source_->next());
      if (m == c_.grad_accum - 1) ZOE_RETURN_IF_ERROR(engine_->update_during_backward(lr));
      ZOE_ASSIGN_OR_RETURN(double loss, model_->train_micro_step(*engine_, b, static_cast<float>(engine_->loss_scale())));
      local[0] += loss;
      local[1] += static_cast<double>(model_->tokens_per_batch(b));
    }
    ZOE_ASSIGN_OR_RETURN(StepResult r, engine_->step(lr));
    ZOE_RETURN_IF_ERROR(comm_.all_reduce_sum(local, 2));
    double loss = local[0] / (comm_.size() * c_.grad_accum);
    state_.steps_done = s + 1;
    state_.last_loss = loss;
    nlohmann::json val_loss;
    if (val_ && ((s + 1) % c_.eval_every == 0 || s + 1 == c_.steps)) {
      ZOE_ASSIGN_OR_RETURN(double v, validate());
      val_loss = v;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto times = Profiler::get().take_step_times();
    ZOE_ASSIGN_OR_RETURN(auto facts, gather_facts(comm_, RankStepFacts::collect(dev_->ledger().snapshot(),
                                                                               tensor().bytes_sent(), nvme_since_last())));
    if (comm_.rank() != 0) return loss;
    nlohmann::json line = {
        {"step", s + 1}, {"loss", loss}, {"val_loss", val_loss}, {"lr", lr},
        {"grad_norm", std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json()},
        {"loss_scale", c_.dtype == DType::kF16 ? nlohmann::json(r.loss_scale) : nlohmann::json()},
        {"skipped", !r.applied}, {"update_taken_back", r.update_taken_back}, {"tokens", local[1]}, {"tokens_per_s", local[1] / secs}, {"step_s", secs},
        {"params", engine_->params()}, {"ranks", comm_.size()}, {"stage", c_.stage},
        {"ledger", ledger_json(facts)}, {"comm_bytes", comm_json(facts)}, {"nvme_bytes", nvme_json(facts)},
        {"time_s", {{"forward", times[0]}, {"backward", times[1]}, {"optimizer", times[2]},
                    {"wait_io", times[3] + times[5]}, {"wait_comm", times[4]}, {"nvme_read", times[3]},
                    {"nvme_write", times[5]}}}};
    ZOE_RETURN_IF_ERROR(report_.write(line));
    progress.update(s + 1, loss, local[1] / secs, secs, facts[0]);
    return loss;
  }

  Config c_;
  Comm& comm_;
  TrainOptions o_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Comm> tensor_comm_;  // null: comm_ carries the tensors too
  Comm& tensor() { return tensor_comm_ ? *tensor_comm_ : comm_; }
  std::unique_ptr<Model> model_;
  std::unique_ptr<ZeroEngine> engine_;
  Engine::NvmeBytes nvme_seen_;  // the engine's NVMe bytes at the last report line
  std::unique_ptr<BatchSource> source_, val_;
  ReportWriter report_;
  TrainState state_;
  std::unique_ptr<tbb::global_control> threads_;
  std::optional<CheckpointRootLock> root_lock_;  // rank 0, with zoe.checkpoint.dir
};

}  // namespace

Result<TrainSummary> run_training(const Config& c, Comm& comm, const TrainOptions& o) {
  TrainJob job(c, comm, o);
  return job.run();
}

}  // namespace zoe

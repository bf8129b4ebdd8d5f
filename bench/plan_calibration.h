// What `zoe plan` measures before it searches, in seconds rather than a training run: the model's
// own micro-step (forward and backward of each unit, from the profiler's spans) on one and two
// blocks of the job's shape, resident, extrapolated to its layers; the CPU Adam's rate; the NVMe
// store's read and write rates on the job's swap path (the store itself, `zoe bench nvme`'s
// code); host memory's copy rate; on more than one rank the collectives' bus bandwidth. On a GPU
// (zoe.device "cuda") the model runs there, and its Adam and the link's rates each way are
// measured beside the CPU's. Cached in a JSON file keyed by the machine (CPU model, threads, the
// GPU), the path and the model's shape, so a second plan reads instead of measuring.
#pragma once
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "plan/plan_search.h"
#include "plan/step_model.h"

namespace zoe {

class Comm;

// What a plan measures, for the other benches too. The CPU Adam's elements a second on the
// process's threads (fp32 state; gradients and weights in `dtype`), best of three.
double measure_cpu_adam(DType dtype);
// The NVMe store's read and write rates at its best 1 MiB case (depth 8 or 32) on a file of
// `bytes` in a directory of its own under `path`: {"read_Bps", "write_Bps", "block_size",
// "queue_depth"}.
Result<nlohmann::json> measure_nvme_rates(const std::string& path, uint64_t bytes);

struct PlanCalibrationOptions {
  std::string cache_path = "out/plan/calibration.json";
  bool recalibrate = false;     // measure even when the cache has the figures
  std::FILE* human = nullptr;   // what was measured (or read), one line each
  // The job's ranks (null: one). Every rank measures at the same time, as they will train (the
  // cores and the disk shared), and the collectives' rates; rank 0 alone writes the cache.
  Comm* comm = nullptr;
  // The model's parameters when it is not the config's GPT-2 (a described model): the NVMe
  // measurements are sized by it. 0: the config's GPT-2.
  int64_t model_elems = 0;
};

class PlanCalibration {
 public:
  // `job` is the user's configuration (the model's shape, dtypes, compute dtype, swap path).
  PlanCalibration(const Config& job, PlanCalibrationOptions o);

  // The machine's rates: measured, or from the cache.
  Result<PlanRates> rates();
  // The model's micro-step at micro-batch b, with or without activation checkpointing: the
  // fetches in GPT-2's order with each unit's measured compute, the activations' bytes.
  Result<MicroStepWork> micro_step(int b, bool checkpointing);
  Status save() const;  // the cache, with what this run measured

  // The key the cache files this machine's figures under (with the ranks sharing it, and the GPU
  // when the job's device is one).
  static std::string machine_key(int ranks = 1, const std::string& device = "cpu");

 private:
  struct UnitTimes {  // one micro-step, seconds; bytes of the model's device buffers
    double encoder_f = 0, block_f = 0, head_f = 0, encoder_b = 0, block_b = 0, head_b = 0;
    double act_fixed = 0, act_block = 0;
    double step_s = 0, step_elems = 0, step_units = 0;  // a GPU's resident step after the micro-step
  };
  Result<UnitTimes> measure_model(int b, bool checkpointing);
  Result<double> measure_fetch_overhead(double copy_Bps);
  bool on_gpu() const { return job_.device == "cuda"; }
  uint64_t model_budget(uint64_t state_bytes) const;  // the device budget a measured model runs in
  int ranks() const;
  Status together() const;  // a barrier: the ranks start a measurement at once
  std::string model_key(int b, bool checkpointing) const;
  int measured_layers() const;  // blocks of the model the micro-steps are measured on
  int64_t model_elems() const;  // the job's parameters

  Config job_;
  PlanCalibrationOptions o_;
  nlohmann::json cache_;
};

}  // namespace zoe

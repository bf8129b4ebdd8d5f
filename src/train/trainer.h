// The training job of `zoe train`: data -> model -> engine, one optimizer step at a time, with
// the report, the trace, progress output and checkpoints. Runs on every rank.
#pragma once
#include <string>

#include "comm/comm.h"
#include "common/config.h"
#include "nvme/nvme_env.h"
#include "zoe/status.h"

namespace zoe {

struct TrainOptions {
  std::string report_path;
  std::string trace_path;
  bool quiet = false;
  NvmeEnv* nvme_env = nullptr;  // the NVMe tier's environment (null: the real one; tests inject faults)
};

struct TrainSummary {
  double final_loss = 0;
  int64_t steps = 0;
  std::string checkpoint;
};

// Checks that the configuration can run on this world (batch sizes, devices, offload tiers).
Status validate_for_world(const Config& c, int world);
// zoe.compute_dtype as it runs: "fp32" or "bf16" ("auto" resolved for c's dtype, model and device).
std::string resolve_compute_dtype(const Config& c);

Result<TrainSummary> run_training(const Config& c, Comm& comm, const TrainOptions& o);

}  // namespace zoe

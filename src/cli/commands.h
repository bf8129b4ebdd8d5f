// The subcommands of the `zoe` binary (contracts.md). Each returns the process exit code:
// 0 success, 2 bad input (one line naming the key/file/flag), 1 runtime failure.
#pragma once
#include <string>
#include <vector>

#include <cstdio>

#include "comm/comm.h"
#include "common/config.h"
#include "zoe/status.h"

namespace zoe::cli {

struct TrainArgs {
  std::string config;               // empty: the embedded default job
  std::vector<std::string> sets;    // --set key.path=value
  std::string report, trace;
  bool quiet = false;
  std::string plan;                 // "auto": plan the configuration first (zoe plan)
};
int train_command(const TrainArgs& a);

struct EstimateArgs {
  double params = 0;
  int ranks = 1;
  std::string config;
  bool json = false;
};
int estimate_command(const EstimateArgs& a);

int info_command();

struct PlanArgs {
  std::string config;               // empty: the embedded default job
  std::vector<std::string> sets;
  std::string out = "out/plan/plan.json";         // the best configuration, as a config file
  std::string cache = "out/plan/calibration.json";
  std::string model_work;  // a described model (zoe.torch.describe's file); empty: the config's GPT-2
  int top = 5;
  bool recalibrate = false;
  bool json = false;
};
int plan_command(const PlanArgs& a);
// The job with the plan's best configuration in place (what `zoe train --plan auto` runs): every
// rank of `comm` measures, rank 0's choice goes to all; the calibration, the search and the
// choice are told to `human` on rank 0 when it is not null.
Result<Config> plan_config(const Config& c, const std::string& cache, std::FILE* human, Comm& comm);

struct ExportArgs {
  std::string checkpoint, out;
};
int export_command(const ExportArgs& a);

struct BenchArgs {
  std::string what;
  bool json = false;
  std::vector<std::string> sizes;   // --size, elements or bytes per case (bench-specific)
  std::vector<int> threads;
  int iters = 0;
  bool no_torch = false;
  bool torch_compile = false;       // --torch-compile: `bench gpu`'s row against torch.compile + autocast
  bool smoke = false;               // --smoke: `bench gpu`, `bench offload` at toy sizes
  std::string device;               // --device: `bench offload`'s device (cpu, cuda; default cpu)
  std::string python;
  std::string dir;                  // --dir: where `bench nvme` puts its test file
  std::string trace;                // --trace: `bench offload` keeps one step's timeline
  bool no_checksums = false;        // --no-checksums: `bench offload` with zoe.checksums false; `bench nvme` without its checksum rows
  int64_t aio_block_size = 0;       // --aio-block-size, --aio-queue-depth: `bench offload`'s store, `bench nvme`'s one case (0: defaults)
  int aio_queue_depth = 0;
  std::string dtype;               // --dtype: `bench step`'s training (bf16: bf16 compute; default fp32), `bench gemm`'s type (default both)
};
int bench_command(const BenchArgs& a);

int exit_code(const Status& s);
// Prints "zoe: <message>" to stderr and returns exit_code(s).
int report_error(const Status& s);

// The embedded default job of `zoe train` without --config.
std::string default_config_json();

}  // namespace zoe::cli

// zoe: one binary, subcommands (contracts.md).
#include <cstdio>
#include <exception>
#include <new>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/signal_exit.h"

int main(int argc, char** argv) {
  using namespace zoe::cli;
  CLI::App app{"zoe - ZeRO Offload Engine: train models larger than accelerator memory"};
  app.require_subcommand(1);

  TrainArgs ta;
  auto* train = app.add_subcommand("train", "train a model (multi-rank: mpirun -np N zoe train ...)");
  train->add_option("--config", ta.config, "JSON config (DeepSpeed key names); default: the embedded demo job");
  train->add_option("--set", ta.sets, "override one key: key.path=JSON value (repeatable)");
  train->add_option("--report", ta.report, "write one JSON line per step here (rank 0)");
  train->add_option("--trace", ta.trace, "write a Chrome trace here");
  train->add_flag("--quiet", ta.quiet, "no progress output");
  train->add_option("--plan", ta.plan, "auto: run the fastest configuration that fits, as `zoe plan` finds it (rank 0's choice on every rank)")
      ->check(CLI::IsMember({"auto"}));

  EstimateArgs ea;
  auto* est = app.add_subcommand("estimate", "per-rank memory of model states for ZeRO stages 0-3");
  est->add_option("--params", ea.params, "number of parameters (e.g. 1e9)")->required()->check(CLI::PositiveNumber);
  est->add_option("--ranks", ea.ranks, "data-parallel ranks")->check(CLI::Range(1, 1 << 24));
  est->add_option("--config", ea.config, "take precision and offload tiers from this config");
  est->add_flag("--json", ea.json, "machine-readable output");

  BenchArgs ba;
  auto* bench = app.add_subcommand("bench", "benchmarks: measured figure, in-run baseline and their ratio");
  bench->add_option("what", ba.what, "adam | comm | gemm | gpu | nvme | offload | copy | step")->required();
  bench->add_flag("--json", ba.json, "machine-readable output");
  bench->add_option("--size", ba.sizes, "problem sizes (bench-specific; repeatable)");
  bench->add_option("--threads", ba.threads, "thread counts (repeatable)");
  bench->add_option("--iters", ba.iters, "timed repetitions per case");
  bench->add_flag("--no-torch", ba.no_torch, "skip the PyTorch rows");
  bench->add_flag("--torch-compile", ba.torch_compile,
                  "gpu: also the bf16 row against torch.compile + autocast (its compile takes a minute or more)");
  bench->add_flag("--smoke", ba.smoke,
                  "gpu: every row at toy sizes without the peer; offload: a toy model; to check that the bench runs");
  bench->add_option("--device", ba.device, "offload: the device the cases train on (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  bench->add_option("--python", ba.python, "python interpreter with torch for the peer rows");
  bench->add_option("--dir", ba.dir, "nvme: directory for the test file (default out/bench-nvme); offload: the swap "
                                     "directory (default out/bench-offload)");
  bench->add_option("--dtype", ba.dtype, "step: fp32, or bf16 (bf16 training with bf16 compute); gemm: this type only (default both)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  bench->add_option("--trace", ba.trace, "offload: write the Chrome trace of one offloaded step here");
  bench->add_flag("--no-checksums", ba.no_checksums,
                  "offload: swap blocks without xxh3 sums (zoe.checksums false); nvme: no checksum-cost rows");
  bench->add_option("--aio-block-size", ba.aio_block_size,
                    "offload: aio.block_size of the swap store (default 1 MiB; `zoe bench nvme` finds the best); "
                    "nvme: this block size only (default 256 KiB, 1, 4 and 16 MiB)")
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 30));
  bench->add_option("--aio-queue-depth", ba.aio_queue_depth,
                    "offload: aio.queue_depth of the swap store (default 8); nvme: this depth only (default 8 and 32)")
      ->check(CLI::Range(1, 4096));

  PlanArgs pa;
  auto* plan = app.add_subcommand("plan", "the fastest configuration that fits, from measured rates (under mpirun: N ranks)");
  plan->add_option("--config", pa.config, "the job (model, batch, dtypes, budgets, swap path); default: the demo job");
  plan->add_option("--set", pa.sets, "override one key: key.path=JSON value (repeatable)");
  plan->add_option("--out", pa.out, "write the best configuration here (default out/plan/plan.json)");
  plan->add_option("--cache", pa.cache, "the calibration cache (default out/plan/calibration.json)");
  plan->add_option("--model-work", pa.model_work,
                   "plan the model zoe.torch.describe measured into this file (its units and micro-steps) "
                   "instead of the config's GPT-2");
  plan->add_option("--top", pa.top, "configurations to print (default 5)")->check(CLI::Range(1, 1 << 20));
  plan->add_flag("--recalibrate", pa.recalibrate, "measure again even where the cache has the figures");
  plan->add_flag("--json", pa.json, "machine-readable output");

  ExportArgs xa;
  auto* exp = app.add_subcommand("export", "consolidated fp32 weights of a checkpoint as safetensors");
  exp->add_option("--checkpoint", xa.checkpoint, "a checkpoint directory, or zoe.checkpoint.dir for its newest")
      ->required();
  exp->add_option("--out", xa.out, "the .safetensors file to write")->required();

  app.add_subcommand("info", "version, build options, CPU ISA, GPUs, backends");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "zoe: %s (see zoe %s--help)\n", e.what(),
                 app.get_subcommands().empty() ? "" : (app.get_subcommands()[0]->get_name() + " ").c_str());
    return 2;
  }
  // train and export write files a signal must not leave behind (a swap directory, a checkpoint or
  // export in progress): there a signal ends the job as an error does (common/signal_exit.h).
  if (*train || *exp) zoe::SignalExit::Install();
  // Nothing escapes as an exception: bad input is exit 2 (a Status), anything unexpected exit 1
  // with what it was.
  try {
    if (*train) return train_command(ta);
    if (*est) return estimate_command(ea);
    if (*plan) return plan_command(pa);
    if (*bench) return bench_command(ba);
    if (*exp) return export_command(xa);
    return info_command();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "zoe: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zoe: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "zoe: internal error (unknown exception)\n");
  }
  return 1;
}

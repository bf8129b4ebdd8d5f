// `zoe train`: sets up ranks (mpirun -> MPI, else one rank), loads the config, runs the job.
#include <mpi.h>

#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "comm/comm.h"
#include "common/config.h"
#include "common/signal_exit.h"
#include "train/backend.h"
#include "train/trainer.h"

namespace zoe::cli {

namespace {

// How a failed rank ends. If every rank failed (input errors are found alike on every rank;
// runtime errors are shared through agree()), all meet at a barrier within seconds and exit
// together, rank 0 alone printing an input error. A rank that fails alone while the others wait
// in a collective says which rank it is and why, then aborts the job: never a hang.
int fail(Comm& comm, const Status& st) {
  SignalExit::ending();
  constexpr double kMeetSeconds = 3.0;
  int code = exit_code(st);
  bool root = comm.rank() == 0, together = comm.size() == 1 || comm.barrier_within(kMeetSeconds);
  if (root || code != 2 || !together)
    std::fprintf(stderr, "zoe: %s%s\n", comm.size() > 1 ? fmt::format("rank {}: ", comm.rank()).c_str() : "",
                 st.message().c_str());
  if (!together) {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  finalize_mpi();
  return code;
}

}  // namespace

int train_command(const TrainArgs& a) {
  auto made = make_comm();
  if (!made.ok()) return report_error(made.status());
  std::unique_ptr<Comm> comm = std::move(made).value();
  bool root = comm->rank() == 0;
  auto cfg = a.config.empty() ? parse_config(default_config_json(), a.sets, "the embedded default config")
                              : load_config_file(a.config, a.sets);
  Status st = cfg.status();
  if (st.ok() && a.plan == "auto") {  // every rank measures; rank 0's choice is every rank's
    cfg = plan_config(*cfg, "out/plan/calibration.json", a.quiet ? nullptr : stdout, *comm);
    st = cfg.status();
  }
  Result<TrainSummary> sum = TrainSummary{};
  if (st.ok()) {
    TrainOptions o{a.report, a.trace, a.quiet};
    sum = run_training(cfg.value(), *comm, o);
    st = sum.status();
  }
  if (!st.ok()) return fail(*comm, st);
  if (root && !a.quiet) {
    fmt::print("done: {} steps, final loss {:.4f}\n", sum->steps, sum->final_loss);
    if (!sum->checkpoint.empty()) fmt::print("checkpoint: {}\n", sum->checkpoint);
  }
  comm.reset();
  finalize_mpi();
  return 0;
}

}  // namespace zoe::cli

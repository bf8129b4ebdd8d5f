// `zoe train`: sets up ranks (mpirun -> MPI, else one rank), loads the config, runs the job.
#include <mpi.h>

#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "comm/comm.h"
#include "common/config.h"
#include "train/trainer.h"

namespace zoe::cli {

int train_command(const TrainArgs& a) {
  std::unique_ptr<Comm> comm;
  if (launched_by_mpirun()) {
    auto r = make_mpi_comm();
    if (!r.ok()) return report_error(r.status());
    comm = std::move(r).value();
  } else {
    comm = make_self_comm();
  }
  bool root = comm->rank() == 0;
  auto cfg = a.config.empty() ? parse_config(default_config_json(), a.sets, "the embedded default config")
                              : load_config_file(a.config, a.sets);
  Status st = cfg.status();
  Result<TrainSummary> sum = TrainSummary{};
  if (st.ok()) {
    TrainOptions o{a.report, a.trace, a.quiet};
    sum = run_training(cfg.value(), *comm, o);
    st = sum.status();
  }
  if (!st.ok()) {
    // Input errors are found identically on every rank: one line from rank 0. A runtime failure
    // may hit one rank while the others wait in a collective: say which, and abort them all.
    if (root || exit_code(st) != 2)
      std::fprintf(stderr, "zoe: %s%s\n", comm->size() > 1 && !root ? fmt::format("rank {}: ", comm->rank()).c_str() : "",
                   st.message().c_str());
    int code = exit_code(st);
    if (comm->size() > 1 && code != 2) MPI_Abort(MPI_COMM_WORLD, code);
    comm.reset();
    finalize_mpi();
    return code;
  }
  if (root && !a.quiet) {
    fmt::print("done: {} steps, final loss {:.4f}\n", sum->steps, sum->final_loss);
    if (!sum->checkpoint.empty()) fmt::print("checkpoint: {}\n", sum->checkpoint);
  }
  comm.reset();
  finalize_mpi();
  return 0;
}

}  // namespace zoe::cli

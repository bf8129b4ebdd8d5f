// The main() of the *_mpi_test executables that reach MPI through zoe's Comm: gtest under
// mpirun, the listing printed by rank 0 only, every rank's failure failing the run.
#pragma once
#include "comm/comm.h"

namespace zoe::test {

// Starts MPI, sets *world to the communicator of every rank for the tests' use, runs the tests,
// finalises MPI; the process's exit code.
int mpi_test_main(int argc, char** argv, Comm** world);

}  // namespace zoe::test

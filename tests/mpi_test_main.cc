#include "mpi_test_main.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace zoe::test {

int mpi_test_main(int argc, char** argv, Comm** world) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = make_mpi_comm();
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().message().c_str());
    return 1;
  }
  *world = comm->get();
  if (comm.value()->rank() != 0) {  // rank 0 prints the listing; every rank's failures count
    auto& l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  double worst = rc;
  (void)comm.value()->all_reduce_sum(&worst, 1);
  *world = nullptr;
  comm.value().reset();
  finalize_mpi();
  return worst != 0 ? 1 : 0;
}

}  // namespace zoe::test

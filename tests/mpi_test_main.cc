#include "mpi_test_main.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace zoe::test {
namespace {

// A test that fails on one rank leaves the others in a collective that the failed rank's next
// test never joins: the job ends at once instead of hanging until ctest's timeout.
class AbortOnFailure : public ::testing::EmptyTestEventListener {
 public:
  explicit AbortOnFailure(int rank) : rank_(rank) {}
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (!t.result()->Failed()) return;
    for (int i = 0; rank_ != 0 && i < t.result()->total_part_count(); ++i) {  // rank 0's printer has them
      const ::testing::TestPartResult& p = t.result()->GetTestPartResult(i);
      if (p.failed()) std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_, p.file_name() ? p.file_name() : "?",
                                   p.line_number(), p.message());
    }
    std::fprintf(stderr, "rank %d: %s.%s failed; ending every rank (MPI_Abort) so that none waits in a collective\n",
                 rank_, t.test_suite_name(), t.name());
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  int rank_;
};

}  // namespace

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
  ::testing::UnitTest::GetInstance()->listeners().Append(new AbortOnFailure(comm.value()->rank()));
  int rc = RUN_ALL_TESTS();
  double worst = rc;
  (void)comm.value()->all_reduce_sum(&worst, 1);
  *world = nullptr;
  comm.value().reset();
  finalize_mpi();
  return worst != 0 ? 1 : 0;
}

}  // namespace zoe::test

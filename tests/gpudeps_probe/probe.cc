// The gpudeps probe (tools/gpu-check.sh --probe): uses every library zoe builds against once, then
// checks in /proc/self/maps that each shared object of theirs, OpenMPI's and PMIx's plugins
// included, was loaded from the private prefix ZOE_DEPS_ROOT rather than from the machine's /usr.
#include <cblas.h>
#include <liburing.h>
#include <mpi.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <tbb/parallel_reduce.h>
#include <tbb/blocked_range.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

namespace {

std::string g_root;

TEST(GpuDeps, EveryLibraryWorks) {
  const long sum = tbb::parallel_reduce(
      tbb::blocked_range<long>(0, 1000), 0L,
      [](const tbb::blocked_range<long>& r, long s) { for (long i = r.begin(); i != r.end(); ++i) s += i; return s; },
      [](long a, long b) { return a + b; });
  EXPECT_EQ(sum, 499500);
  EXPECT_EQ(fmt::format("{:>4}", 7), "   7");
  // The header-only two are used lightly: their headers resolving is what is checked, and the
  // instantiations of a full parse would double this file's compile time.
  const nlohmann::json j = 2;
  EXPECT_TRUE(j.is_number());
  EXPECT_EQ(static_cast<int>(CLI::ExitCodes::Success), 0);
  EXPECT_EQ(XXH3_64bits("", 0), 0x2D06800538D394C2ULL);  // xxh3 of nothing
  const float x[3] = {1, 2, 3}, y[3] = {4, 5, 6};
  EXPECT_FLOAT_EQ(cblas_sdot(3, x, 1, y, 1), 32.f);
  struct io_uring ring;  // a sandbox may refuse io_uring: only the call matters here
  if (io_uring_queue_init(4, &ring, 0) == 0) io_uring_queue_exit(&ring);
  int ranks = 0, total = 0, one = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total, ranks);
}

// The dependencies' shared objects: each must come from the prefix, and the core ones must be there.
TEST(GpuDeps, SharedObjectsComeFromThePrefix) {
  const char* const deps[] = {"libmpi", "libopen-", "libpmix", "libhwloc", "libevent", "libtbb", "libfmt",
                              "libopenblas", "libblas", "liblapack", "liburing", "libxxhash", "libgfortran",
                              "libucp", "libucs", "libfabric", "libpsm", "mca_", "pmix_mca_"};
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> seen;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = path.substr(path.rfind('/') + 1);
    bool is_dep = false;
    for (const char* d : deps) is_dep |= base.starts_with(d);
    if (!is_dep) continue;
    EXPECT_TRUE(path.starts_with(g_root + "/")) << path << " was loaded from outside " << g_root;
    seen.insert(base);
  }
  for (const std::string lib : {"libmpi.", "libopen-pal.", "libopen-rte.", "libpmix.", "libtbb.", "libfmt.",
                                "libopenblas", "liburing.", "libxxhash.", "libhwloc.", "libevent_core-"}) {
    bool loaded = false;
    for (const auto& s : seen) loaded |= s.starts_with(lib);
    EXPECT_TRUE(loaded) << lib << "* is not loaded";
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const char* root = std::getenv("ZOE_DEPS_ROOT");
  if (!root || !*root) {
    std::fprintf(stderr, "gpudeps_probe: ZOE_DEPS_ROOT is not set (run it through tools/gpu-check.sh --probe)\n");
    return 1;
  }
  g_root = root;
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one report, rank 0's (every rank's failures still fail the exit status)
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}

// Which checkpoint a multi-rank job resumes: rank 0's choice, on every rank. On a shared file
// system with stale metadata, ranks listing the root themselves could load different steps.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint.h"
#include "comm/comm.h"
#include "mpi_test_main.h"
#include "test_util.h"

namespace zoe {
namespace {

namespace fs = std::filesystem;

Comm* g_comm = nullptr;

void make_step(const std::string& root, const char* name) {
  fs::create_directories(root + "/" + name);
  std::ofstream(root + "/" + name + "/manifest.json") << "{}";
}

TEST(CheckpointMpi, EveryRankResumesTheStepRankZeroChose) {
  Comm& comm = *g_comm;
  std::string root;
  if (comm.rank() == 0) {
    root = test::make_temp_dir("ckpt_mpi");
    make_step(root, "step_00000001");
    make_step(root, "step_00000002");
  }
  uint64_t n = root.size();
  ASSERT_TRUE(comm.broadcast(&n, sizeof(n), 0).ok());
  root.resize(n);
  ASSERT_TRUE(comm.broadcast(root.data(), n, 0).ok());
  // Rank 0 lists at once; the others come late, after a newer step appeared (what a rank with a
  // different view of the directory would see).
  if (comm.rank() != 0) {
    usleep(700 * 1000);
    if (comm.rank() == 1) make_step(root, "step_00000003");
  }
  auto chosen = agree_latest_checkpoint(root, comm);
  ASSERT_TRUE(chosen.ok()) << chosen.status().message();
  EXPECT_EQ(chosen.value(), root + "/step_00000002") << "rank " << comm.rank();
  ASSERT_TRUE(comm.barrier().ok());
  // Nothing there on rank 0 is nothing on every rank (no rank hangs looking for a file).
  std::string empty = root + "/none";
  auto none = agree_latest_checkpoint(empty, comm);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none.value(), "");
  ASSERT_TRUE(comm.barrier().ok());
  if (comm.rank() == 0) fs::remove_all(root);
}

}  // namespace
}  // namespace zoe

int main(int argc, char** argv) { return zoe::test::mpi_test_main(argc, argv, &zoe::g_comm); }

// `zoe bench nvme` on a tiny file: the contract's result fields, fio as the referee where it is
// installed, null ratios (with the reason) where it is not, and the best aio settings snippet.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "nvme_bench.h"
#include "test_util.h"

namespace zoe {
namespace {

NvmeBenchOptions tiny(const std::string& dir) {
  NvmeBenchOptions o;
  o.dir = dir;
  o.file_bytes = 1 << 20;
  o.block_sizes = {64 << 10, 128 << 10};
  o.queue_depths = {2};
  o.reps = 1;
  return o;
}

void expect_fields(const nlohmann::json& j, bool with_fio) {
  ASSERT_EQ(j.at("bench"), "nvme");
  ASSERT_EQ(j.at("results").size(), 4u);  // 2 block sizes x 1 depth x {write, read}
  for (const auto& r : j["results"]) {
    EXPECT_TRUE(r.at("op") == "read" || r.at("op") == "write") << r;
    EXPECT_EQ(r.at("queue_depth"), 2);
    EXPECT_GT(r.at("zoe_GBps").get<double>(), 0);
    if (with_fio) {
      EXPECT_GT(r.at("fio_GBps").get<double>(), 0);
      EXPECT_NEAR(r.at("ratio").get<double>(), r["zoe_GBps"].get<double>() / r["fio_GBps"].get<double>(), 1e-9);
    } else {
      EXPECT_TRUE(r.at("fio_GBps").is_null());
      EXPECT_TRUE(r.at("ratio").is_null());
    }
  }
  EXPECT_EQ(j["results"][2].at("case"), "write/bs=128KiB/qd=2");
  EXPECT_EQ(j["results"][2].at("block_bytes"), 128 << 10);
  const auto& best = j.at("best_aio");
  EXPECT_TRUE(best.at("block_size") == 64 << 10 || best.at("block_size") == 128 << 10);
  EXPECT_EQ(best.at("queue_depth"), 2);
  ASSERT_EQ(j.at("checksum_cost").size(), 2u);
  for (const auto& c : j["checksum_cost"]) {
    EXPECT_GT(c.at("plain_GBps").get<double>(), 0);
    EXPECT_GT(c.at("checksums_GBps").get<double>(), 0);
    EXPECT_EQ(c.at("rounds"), 3) << "three rounds for each of the cases' reps";
    EXPECT_EQ(c.at("checksums_GBps_reps").size(), 3u);
    EXPECT_EQ(c.at("control_GBps_reps").size(), 3u);
    EXPECT_GT(c.at("control_ratio").get<double>(), 0);
  }
}

TEST(NvmeBench, WithoutFioZoeAloneWithNullRatios) {
  const std::string dir = test::make_temp_dir("nvme-bench");
  NvmeBenchOptions o = tiny(dir);
  o.fio = "/nonexistent/fio";
  nlohmann::json j;
  Status st = bench_nvme(o, &j, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_fields(j, false);
  EXPECT_NE(j.at("fio_missing").get<std::string>().find("fio not found"), std::string::npos);
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the stores remove their files";
  std::filesystem::remove_all(dir);
}

TEST(NvmeBench, FioIsTheRefereeOnTheSameFile) {
  std::string out;
  if (test::run_command("fio --version", &out) != 0) GTEST_SKIP() << "fio is not installed (tools/install-deps.sh)";
  const std::string dir = test::make_temp_dir("nvme-bench");
  nlohmann::json j;
  Status st = bench_nvme(tiny(dir), &j, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_fields(j, true);
  const std::string cmd = j.at("fio_command");
  for (const char* flag : {"--ioengine=io_uring", "--direct=1", "--bs=65536", "--iodepth=2", "--size=1048576",
                           "--fixedbufs=1", "--registerfiles=1", "--fallocate=none", "/zoe-bench-rank0/bench.swap"})
    EXPECT_NE(cmd.find(flag), std::string::npos) << flag << " in " << cmd;
  std::filesystem::remove_all(dir);
}

TEST(NvmeBench, RejectsAFileThatIsNotWholeBlocks) {
  NvmeBenchOptions o = tiny("/tmp");
  o.file_bytes = (1 << 20) + 1;
  nlohmann::json j;
  EXPECT_EQ(bench_nvme(o, &j, nullptr).code(), Code::kInvalidInput);
}

}  // namespace
}  // namespace zoe

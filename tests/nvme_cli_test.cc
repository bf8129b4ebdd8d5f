// The NVMe tier through the zoe binary: state on NVMe shows in the report and the progress line,
// swap files go away with the run, links planted in a shared nvme_path are not followed, and a
// file system too small for the planned state is refused before step 1 with what is needed and
// what is free.
#include <gtest/gtest.h>

#include <sys/mount.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace zoe::test {
namespace {

namespace fs = std::filesystem;

const std::string kJob = " train --set zoe.model.type=mlp --set zoe.model.n_layer=4 --set zoe.model.n_embd=128"
                         " --set zero_optimization.stage=3 --set zoe.steps=2 --set steps_per_print=1"
                         " --set zoe.checkpoint.dir='\"\"'"
                         " --set zero_optimization.offload_optimizer.device=nvme"
                         " --set zero_optimization.offload_param.device=nvme";

std::string on(const std::string& dir) {
  return " --set zero_optimization.offload_optimizer.nvme_path='\"" + dir + "\"'" +
         " --set zero_optimization.offload_param.nvme_path='\"" + dir + "\"'";
}

TEST(NvmeCli, StateOnNvmeIsInTheReportAndTheProgressLineAndLeavesNoFiles) {
  std::string d = make_temp_dir("nvmecli");
  std::string out;
  int rc = run_command(kZoe + kJob + on(d + "/nv") + " --report " + d + "/r.jsonl", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("nvme "), std::string::npos) << out;
  EXPECT_EQ(out.find("nvme 0 B"), std::string::npos) << "the progress line shows no bytes on nvme:\n" << out;
  std::ifstream f(d + "/r.jsonl");
  std::string line;
  std::getline(f, line);
  auto j = nlohmann::json::parse(line);
  uint64_t params = j["params"].get<uint64_t>();
  auto nv = j["ledger"][0]["nvme"];
  // bf16 training (the embedded default) at stage 3 on one rank: every state kind, padded.
  EXPECT_GE(nv["param"].get<uint64_t>(), 2 * params);
  EXPECT_GE(nv["master"].get<uint64_t>(), 4 * params);
  EXPECT_GE(nv["exp_avg"].get<uint64_t>(), 4 * params);
  EXPECT_EQ(j["ledger"][0]["device"]["exp_avg"].get<uint64_t>(), 0u);
  for (auto& e : fs::recursive_directory_iterator(d + "/nv")) EXPECT_FALSE(e.is_regular_file()) << e.path();
}

// A shared nvme_path (itself a link) where someone planted a link named like a dead job's swap
// directory, pointing at a directory of *.swap files elsewhere: the run trains, the link is
// neither followed nor removed, and the linked nvme_path is reported once.
TEST(NvmeCli, PlantedLinksInASharedNvmePathAreNotFollowed) {
  std::string d = make_temp_dir("nvmelinks");
  fs::create_directories(d + "/victim");
  fs::create_directories(d + "/scratch");
  std::ofstream(d + "/victim/weights.swap") << "precious";
  fs::create_directory_symlink(d + "/victim", d + "/scratch/zoe-12345-0badf00d-rank0");
  fs::create_directory_symlink(d + "/scratch", d + "/nvlink");
  std::string out;
  int rc = run_command(kZoe + kJob + on(d + "/nvlink"), &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(slurp(d + "/victim/weights.swap"), "precious");
  EXPECT_TRUE(fs::is_symlink(d + "/scratch/zoe-12345-0badf00d-rank0"));
  const std::string told = "nvme_path " + d + "/nvlink is a symbolic link: swap files go to " + d + "/scratch";
  const size_t at = out.find(told);
  EXPECT_NE(at, std::string::npos) << out;
  EXPECT_EQ(out.find(told, at + 1), std::string::npos) << "reported more than once:\n" << out;
  for (auto& e : fs::directory_iterator(d + "/scratch"))
    EXPECT_TRUE(fs::is_symlink(e.path())) << e.path() << " left behind";
  fs::remove_all(d);
}

TEST(NvmeCli, AFileSystemTooSmallIsRefusedBeforeStepOne) {
  std::string d = make_temp_dir("nvmefull");
  fs::create_directories(d + "/small");
  if (mount("tmpfs", (d + "/small").c_str(), "tmpfs", 0, "size=1M") != 0)
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here (" << std::strerror(errno) << "): needs root";
  std::string out;
  // 1 M parameters: 14 MB of state planned on a 1 MiB file system.
  int rc = run_command(kZoe + kJob + on(d + "/small") + " --set zoe.model.n_embd=512 --report " + d + "/r.jsonl", &out);
  umount((d + "/small").c_str());
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("needs"), std::string::npos) << out;
  EXPECT_NE(out.find("free"), std::string::npos) << out;
  EXPECT_EQ(slurp(d + "/r.jsonl").find("\"step\""), std::string::npos) << "a step ran before the refusal";
}

}  // namespace
}  // namespace zoe::test

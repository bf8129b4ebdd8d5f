// The files `zoe train` and `zoe export` read and write, tried as a hostile neighbour and an unlucky
// user would (docs/FILES.md): special files as inputs, files changed under a running job, devices
// and links as outputs, a umask of 000, and signals mid-step and mid-save. Each case names what
// main did at 8800094, before these checks.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace zoe::test {
namespace {

namespace fs = std::filesystem;

// A tiny GPT-2 on an llm.c shard of vocabulary 512, no checkpoints, state in memory.
std::vector<std::string> gpt2_args(const std::string& data) {
  return {"train", "--quiet", "--set", "zoe.model.n_layer=1", "--set", "zoe.model.n_embd=16", "--set",
          "zoe.model.n_head=2", "--set", "zoe.model.n_positions=16", "--set", "zoe.data.seq_len=8", "--set",
          "zoe.model.vocab_size=512", "--set", "zoe.data.format=\"llmc\"", "--set", "zoe.data.train=\"" + data + "\"",
          "--set", "zoe.checkpoint.dir=\"\"", "--set", "zero_optimization.offload_optimizer.device=\"none\"",
          "--set", "zoe.steps=1000000"};
}

// An llm.c shard of n tokens, each below 512.
std::string write_shard(const std::string& path, int n) {
  std::string bytes(1024, '\0');
  int32_t h[3] = {20240520, 1, n};
  std::memcpy(bytes.data(), h, sizeof h);
  for (int i = 0; i < n; ++i) {
    uint16_t t = static_cast<uint16_t>((i * 37) % 512);
    bytes.append(reinterpret_cast<const char*>(&t), 2);
  }
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// zoe started directly (no shell between: signals reach it), its stdout and stderr to `log`.
pid_t spawn_zoe(const std::vector<std::string>& args, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv{const_cast<char*>("zoe")};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(kZoe.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Waits up to `seconds` for `pid`; its exit code, 128 + signal when a signal ended it, or -1 after
// killing it when it did not end in time.
int wait_exit(pid_t pid, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(5000);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Polls until `ready()` or `seconds` pass.
bool wait_for(const std::function<bool()>& ready, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    usleep(1000);
  }
  return true;
}

bool has_step_line(const std::string& report) { return slurp(report).find("\"step\"") != std::string::npos; }

unsigned mode_of(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0 ? st.st_mode & 07777 : 01000000;
}

// main: the data were checked once and then read through the mapping, so ids past the vocabulary
// reached the encoder and the loss (out-of-bounds reads and writes; losses of -162 to -355).
// A tiny GPT-2 job on a shard of 200000 tokens in `dir`, started and past its first step.
struct RunningJob {
  std::string data, report;
  pid_t pid = -1;
};
RunningJob start_gpt2_job(const std::string& dir) {
  RunningJob j{write_shard(dir + "/train.bin", 200000), dir + "/r.jsonl"};
  std::vector<std::string> args = gpt2_args(j.data);
  args.insert(args.end(), {"--report", j.report});
  j.pid = spawn_zoe(args, dir + "/log");
  EXPECT_TRUE(wait_for([&] { return has_step_line(j.report); }, 60)) << slurp(dir + "/log");
  return j;
}

TEST(FilesCli, DataRewrittenInPlaceMidRunEndsTheJobNamingTheFile) {
  std::string dir = make_temp_dir("files");
  auto [data, report, pid] = start_gpt2_job(dir);
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024);
    std::string big(2 * 200000, '\0');
    for (size_t i = 0; i < big.size(); i += 2) big[i] = char(0x60), big[i + 1] = char(0xea);  // 60000
    f.write(big.data(), static_cast<std::streamsize>(big.size()));
  }
  int rc = wait_exit(pid, 60);
  std::string log = slurp(dir + "/log");
  EXPECT_EQ(rc, 2) << log;
  EXPECT_NE(log.find(data), std::string::npos) << log;
  EXPECT_NE(log.find("token 60000"), std::string::npos) << log;
  EXPECT_NE(log.find("is not below vocab_size 512"), std::string::npos) << log;
  EXPECT_EQ(slurp(report).find("\"loss\":-"), std::string::npos) << slurp(report);
}

// main: SIGBUS, exit 135 and no message.
TEST(FilesCli, DataTruncatedMidRunEndsTheJobNamingTheFile) {
  std::string dir = make_temp_dir("files");
  auto [data, report, pid] = start_gpt2_job(dir);
  fs::resize_file(data, 1024 + 2 * 100);
  int rc = wait_exit(pid, 60);
  std::string log = slurp(dir + "/log");
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("data file changed while the job ran"), std::string::npos) << log;
  EXPECT_NE(log.find(data), std::string::npos) << log;
}

// main: a FIFO as data hung after the swap files were made, /dev/zero as data or init was read
// until memory ran out, a FIFO manifest or xxh3 hung resume and export, a FIFO lock was
// "ftruncate: Invalid argument". Each must end within seconds, in bounded memory, exit 2.
TEST(FilesCli, SpecialFilesAsInputsEndWithinSecondsExitTwo) {
  std::string dir = make_temp_dir("files");
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(symlink("/dev/zero", (dir + "/zero").c_str()), 0);
  std::string data = write_shard(dir + "/train.bin", 1000);
  // Checkpoint roots with a FIFO as the lock, as a checkpoint's manifest.xxh3, as its manifest.
  std::string mlp = " train --quiet --set zoe.model.type=mlp --set zoe.steps=1 "
                    "--set zero_optimization.offload_optimizer.device='\"none\"' --set zoe.checkpoint.every=1 ";
  for (const char* root : {"lock", "xxh3", "manifest"}) {
    std::string out;
    ASSERT_EQ(run_command(kZoe + mlp + "--set zoe.checkpoint.dir='\"" + dir + "/" + root + "\"'", &out), 0) << out;
  }
  ASSERT_EQ(mkfifo((dir + "/lock/.zoe-checkpoint.lock.new").c_str(), 0600), 0);
  fs::rename(dir + "/lock/.zoe-checkpoint.lock.new", dir + "/lock/.zoe-checkpoint.lock");
  fs::remove(dir + "/xxh3/step_00000001/manifest.xxh3");
  ASSERT_EQ(mkfifo((dir + "/xxh3/step_00000001/manifest.xxh3").c_str(), 0600), 0);
  fs::remove(dir + "/manifest/step_00000001/manifest.json");
  ASSERT_EQ(mkfifo((dir + "/manifest/step_00000001/manifest.json").c_str(), 0600), 0);

  auto gpt = [&](const std::string& extra) {
    std::string s = " train --quiet --set zoe.model.n_layer=1 --set zoe.model.n_embd=16 --set zoe.model.n_head=2"
                    " --set zoe.model.n_positions=16 --set zoe.data.seq_len=8 --set zoe.checkpoint.dir='\"\"'";
    return s + " " + extra;
  };
  struct Case {
    std::string args, needle;
  } cases[] = {
      {gpt("--set zoe.data.train='\"" + dir + "/fifo\"'"), "is a FIFO"},
      {gpt("--set zoe.data.train='\"/dev/zero\"'"), "is a character device"},
      {gpt("--set zoe.data.train='\"" + dir + "/zero\"'"), "is a character device"},
      {gpt("--set zoe.data.format='\"llmc\"' --set zoe.model.vocab_size=512 --set zoe.data.train='\"" + data +
           "\"' --set zoe.init='\"/dev/zero\"'"), "is a character device"},
      {gpt("--set zoe.data.format='\"llmc\"' --set zoe.model.vocab_size=512 --set zoe.data.train='\"" + data +
           "\"' --set zoe.init='\"" + dir + "/fifo\"'"), "is a FIFO"},
      {mlp + "--set zoe.checkpoint.dir='\"" + dir + "/lock\"'", ".zoe-checkpoint.lock"},
      {mlp + "--set zoe.checkpoint.dir='\"" + dir + "/xxh3\"'", "manifest.xxh3"},
      {" export --checkpoint " + dir + "/xxh3 --out " + dir + "/x.safetensors", "manifest.xxh3"},
      {" export --checkpoint " + dir + "/manifest/step_00000001 --out " + dir + "/y.safetensors", "manifest.json"},
  };
  for (const Case& c : cases) {
    std::string out;
    auto t0 = std::chrono::steady_clock::now();
    int rc = run_command(limit_memory_kb(8000000) + "timeout -s KILL 30 " + kZoe + c.args, &out);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, 2) << c.args << "\n" << out;
    EXPECT_LT(s, 10) << c.args;
    EXPECT_NE(out.find(c.needle), std::string::npos) << c.args << "\n" << out;
  }
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
}

// main: `--out /dev/null` replaced the device node with a regular file (as root: the system's;
// so this test uses a device node of its own);
// a link at --out was replaced too.
TEST(FilesCli, ExportReplacesOnlyARegularFile) {
  std::string dir = make_temp_dir("files");
  std::string out;
  ASSERT_EQ(run_command(kZoe + " train --quiet --set zoe.model.type=mlp --set zoe.steps=1 --set zoe.checkpoint.every=1"
                        " --set zero_optimization.offload_optimizer.device='\"none\"' --set zoe.checkpoint.dir='\"" +
                        dir + "/ck\"'", &out), 0) << out;
  std::ofstream(dir + "/precious") << "mine";
  fs::create_symlink(dir + "/precious", dir + "/link.safetensors");
  ASSERT_EQ(mkfifo((dir + "/fifo.safetensors").c_str(), 0600), 0);
  std::vector<std::string> targets = {dir + "/link.safetensors", dir + "/fifo.safetensors"};
  const std::string node = make_device_node(dir);
  if (!node.empty()) targets.push_back(node);
  for (const std::string& target : targets) {
    int rc = run_command("timeout -s KILL 30 " + kZoe + " export --checkpoint " + dir + "/ck --out " + target, &out);
    EXPECT_EQ(rc, 2) << target << "\n" << out;
    EXPECT_NE(out.find(target), std::string::npos) << out;
    EXPECT_NE(out.find("replaces only a regular file"), std::string::npos) << out;
  }
  if (!node.empty()) {
    EXPECT_TRUE(fs::is_character_file(fs::symlink_status(node)));
  }
  EXPECT_TRUE(fs::is_symlink(dir + "/link.safetensors"));
  EXPECT_EQ(slurp(dir + "/precious"), "mine");
  ASSERT_EQ(run_command(kZoe + " export --checkpoint " + dir + "/ck --out " + dir + "/ok.safetensors", &out), 0) << out;
  EXPECT_EQ(mode_of(dir + "/ok.safetensors"), 0600u);
}

// main: under umask 000 the checkpoint root was 0777 and the report 0666, which let anyone plant
// the links above.
TEST(FilesCli, UnderUmaskZeroWhatZoeMakesIsItsOwnersAlone) {
  std::string dir = make_temp_dir("files");
  std::string out;
  ASSERT_EQ(run_command("umask 000; " + kZoe + " train --quiet --set zoe.model.type=mlp --set zoe.steps=1"
                        " --set zoe.checkpoint.every=1 --set zoe.checkpoint.dir='\"" + dir + "/a/ck\"'"
                        " --set zero_optimization.offload_optimizer.nvme_path='\"" + dir + "/nvme\"'"
                        " --report " + dir + "/r.jsonl --trace " + dir + "/t.json", &out), 0) << out;
  for (const char* d : {"/a", "/a/ck", "/a/ck/step_00000001", "/nvme"}) EXPECT_EQ(mode_of(dir + d), 0700u) << d;
  for (const char* f : {"/r.jsonl", "/t.json", "/a/ck/step_00000001/manifest.json", "/a/ck/step_00000001/manifest.xxh3",
                        "/a/ck/.zoe-checkpoint.lock"})
    EXPECT_EQ(mode_of(dir + f), 0600u) << f;
  for (auto& e : fs::directory_iterator(dir + "/a/ck/step_00000001"))
    EXPECT_EQ(mode_of(e.path().string()), 0600u) << e.path();
}

// main: the report was truncated before the inputs were checked, so a typo in the data path
// emptied the last run's report.
TEST(FilesCli, AReportIsNotEmptiedByAJobThatFailsBeforeItsFirstStep) {
  std::string dir = make_temp_dir("files");
  std::ofstream(dir + "/r.jsonl") << "{\"step\": 1, \"loss\": 5.5}\n";
  std::string out;
  int rc = run_command(kZoe + " train --quiet --set zoe.data.train='\"" + dir + "/typo.bin\"' --report " + dir +
                       "/r.jsonl --set zoe.checkpoint.dir='\"\"'", &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(slurp(dir + "/r.jsonl"), "{\"step\": 1, \"loss\": 5.5}\n");
}

// The job's swap directories under nvme_path (zoe-<job>-rank<r>).
int swap_dirs(const std::string& nvme) {
  int n = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(nvme, ec)) n += e.path().filename().string().rfind("zoe-", 0) == 0;
  return n;
}

// main: Ctrl-C left the whole NVMe state (fp32 master and Adam moments) on disk until a later job
// reused the same path.
TEST(FilesCli, SigintMidStepRemovesTheSwapFilesAndExits130) {
  std::string dir = make_temp_dir("files");
  std::string report = dir + "/r.jsonl";
  pid_t pid = spawn_zoe({"train", "--quiet", "--set", "zoe.steps=1000000", "--set", "zoe.checkpoint.dir=\"\"", "--set",
                         "zero_optimization.offload_optimizer.nvme_path=\"" + dir + "/nvme\"", "--report", report},
                        dir + "/log");
  ASSERT_TRUE(wait_for([&] { return has_step_line(report); }, 120)) << slurp(dir + "/log");
  ASSERT_EQ(swap_dirs(dir + "/nvme"), 1);
  kill(pid, SIGINT);
  int rc = wait_exit(pid, 60);
  std::string log = slurp(dir + "/log");
  EXPECT_EQ(rc, 130) << log;
  EXPECT_NE(log.find("SIGINT"), std::string::npos) << log;
  EXPECT_EQ(swap_dirs(dir + "/nvme"), 0) << log;
}

// zoe with its stdout and stderr on a pipe: the read end comes back in *reader.
pid_t spawn_zoe_to_pipe(const std::vector<std::string>& args, int* reader) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    std::vector<char*> argv{const_cast<char*>("zoe")};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(kZoe.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  *reader = fds[0];
  return pid;
}

// Before: with its output's reader gone (`zoe train | tee` and Ctrl-C, a parent that died), the
// signal thread's line raised SIGPIPE, which ended the process before the cleanups: a 3.3 B job's
// 43 GB of swap files stayed. A SIGTERM then, or the broken pipe itself, now cleans up.
TEST(FilesCli, ASignalWithItsOutputsReaderGoneStillRemovesTheSwapFiles) {
  for (bool quiet : {true, false}) {
    std::string dir = make_temp_dir("files");
    std::string report = dir + "/r.jsonl";
    std::vector<std::string> args = {"train", "--set", "zoe.steps=1000000", "--set", "zoe.checkpoint.dir=\"\"", "--set",
                                     "steps_per_print=1", "--set",
                                     "zero_optimization.offload_optimizer.nvme_path=\"" + dir + "/nvme\"", "--report",
                                     report};
    if (quiet) args.insert(args.begin() + 1, "--quiet");
    int reader = -1;
    pid_t pid = spawn_zoe_to_pipe(args, &reader);
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(wait_for([&] { return has_step_line(report); }, 120));
    ASSERT_EQ(swap_dirs(dir + "/nvme"), 1);
    close(reader);                     // the reader goes away
    if (quiet) kill(pid, SIGTERM);     // quiet: a signal finds the pipe broken; else the next progress line does
    int rc = wait_exit(pid, 60);
    EXPECT_EQ(rc, quiet ? 128 + SIGTERM : 128 + SIGPIPE) << (quiet ? "SIGTERM" : "a progress line");
    EXPECT_EQ(swap_dirs(dir + "/nvme"), 0) << (quiet ? "SIGTERM" : "a progress line");
  }
}

// main: a save in progress left step_*.tmp.* (and the swap files) behind on SIGINT or SIGTERM.
TEST(FilesCli, ASignalMidSaveAbandonsTheSaveAndKeepsTheLastCheckpoint) {
  std::string dir = make_temp_dir("files");
  std::string ck = dir + "/ck";
  for (int sig : {SIGINT, SIGTERM}) {
    pid_t pid = spawn_zoe({"train", "--quiet", "--set", "zoe.model.type=\"mlp\"", "--set", "zoe.model.n_embd=1024",
                           "--set", "zoe.model.n_layer=8", "--set", "zoe.steps=1000000", "--set", "zoe.checkpoint.every=1",
                           "--set", "zoe.checkpoint.keep=1", "--set", "zoe.checkpoint.dir=\"" + ck + "\"", "--set",
                           "zero_optimization.offload_optimizer.nvme_path=\"" + dir + "/nvme\""},
                          dir + "/log");
    auto saving = [&] {
      std::error_code ec;
      for (auto& e : fs::directory_iterator(ck, ec))
        if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
      return false;
    };
    auto complete = [&] {  // a finished save to fall back on
      std::error_code ec;
      for (auto& e : fs::directory_iterator(ck, ec))
        if (e.path().filename().string().find(".tmp.") == std::string::npos && fs::exists(e.path() / "manifest.xxh3"))
          return true;
      return false;
    };
    ASSERT_TRUE(wait_for([&] { return complete() && saving(); }, 120)) << slurp(dir + "/log");
    kill(pid, sig);
    int rc = wait_exit(pid, 60);
    std::string log = slurp(dir + "/log");
    EXPECT_EQ(rc, 128 + sig) << log;
    EXPECT_FALSE(saving()) << "a save's .tmp was left behind\n" << log;
    EXPECT_EQ(swap_dirs(dir + "/nvme"), 0) << log;
  }
  // The job resumes from what the last complete save left.
  std::string out;
  EXPECT_EQ(run_command(kZoe + " export --checkpoint " + ck + " --out " + dir + "/w.safetensors", &out), 0) << out;
}

}  // namespace
}  // namespace zoe::test

// Ranks that fail: a rank killed mid-step, or one that fails alone while the others wait in a
// collective, ends the whole job within seconds with a line naming the rank; ranks that all fail
// alike exit together with one line. Never a hang.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "test_util.h"

namespace zoe::test {
namespace {

using Clock = std::chrono::steady_clock;

// A job long enough to be caught mid-step: 3 ranks, stage 3, an MLP that steps in ~0.1 s.
const std::string kJob =
    " train --quiet --set zoe.model.type=mlp --set zoe.model.n_layer=4 --set zoe.model.n_embd=256"
    " --set zero_optimization.stage=3 --set zoe.steps=100000";

// Starts `cmd` under sh with its output in `log`; returns the shell's pid (exec'd into mpirun).
pid_t spawn(const std::string& cmd, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    std::string full = "exec env " + cmd + " > " + log + " 2>&1";  // env: cmd starts with VAR=value
    execl("/bin/sh", "sh", "-c", full.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

// The pid of the process whose environment says it is MPI rank `rank` ("" if none yet).
pid_t find_rank(int rank, pid_t under) {
  std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  DIR* d = opendir("/proc");
  pid_t found = 0;
  while (dirent* e = d ? readdir(d) : nullptr) {
    pid_t p = static_cast<pid_t>(atoi(e->d_name));
    if (p <= 0) continue;
    std::string env = slurp("/proc/" + std::string(e->d_name) + "/environ");
    std::string stat = slurp("/proc/" + std::string(e->d_name) + "/stat");
    if (env.find(want) == std::string::npos || stat.find("zoe") == std::string::npos) continue;
    // Only a descendant of our mpirun (its parent chain reaches `under`).
    size_t close = stat.rfind(')');
    pid_t ppid = close == std::string::npos ? 0 : static_cast<pid_t>(atoi(stat.c_str() + close + 4));
    if (ppid == under) found = p;
  }
  if (d) closedir(d);
  return found;
}

// Waits for pid to exit (at most `limit`); returns its exit status, or -1 on timeout (killed then).
int wait_exit(pid_t pid, std::chrono::seconds limit, double* seconds) {
  auto t0 = Clock::now();
  for (;;) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (Clock::now() - t0 > limit) {
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(RankFailure, KillingOneOfThreeRanksMidStepEndsTheJobNamingTheRank) {
  std::string d = make_temp_dir("kill");
  pid_t job = spawn(kMpirun + "-np 3 " + kZoe + kJob + " --report " + d + "/r.jsonl", d + "/log");
  // Wait until steps are being taken, then kill rank 1 where it stands.
  auto t0 = Clock::now();
  while (slurp(d + "/r.jsonl").find("\"step\":3") == std::string::npos && Clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pid_t victim = find_rank(1, job);
  ASSERT_GT(victim, 0) << "rank 1 not found; log:\n" << slurp(d + "/log");
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  double secs = 0;
  int rc = wait_exit(job, std::chrono::seconds(30), &secs);
  std::string log = slurp(d + "/log");
  ASSERT_NE(rc, -1) << "the job hung after rank 1 was killed:\n" << log;
  EXPECT_NE(rc, 0);
  EXPECT_LT(secs, 10.0) << log;
  EXPECT_NE(log.find("rank 1"), std::string::npos) << "no line names rank 1:\n" << log;
  std::printf("[ info ] job ended %.2f s after rank 1 was killed (exit %d)\n", secs, rc);
}

TEST(RankFailure, ARankThatFailsAloneAbortsTheOthersWithinSeconds) {
  // MPMD: rank 1 gets a device budget too small for its state and fails at start-up, while
  // ranks 0 and 2 go on into the first collective and wait for it.
  std::string d = make_temp_dir("alone");
  std::string rank1 = kZoe + kJob + " --set zoe.device_memory_budget=4096";
  pid_t job = spawn(kMpirun + "-np 1 " + kZoe + kJob + " : -np 1 " + rank1 + " : -np 1 " + kZoe + kJob, d + "/log");
  double secs = 0;
  int rc = wait_exit(job, std::chrono::seconds(60), &secs);
  std::string log = slurp(d + "/log");
  ASSERT_NE(rc, -1) << "the job hung after rank 1 failed:\n" << log;
  EXPECT_NE(rc, 0);
  EXPECT_LT(secs, 15.0) << log;  // start-up plus the 3 s the failed rank waits for the others
  EXPECT_NE(log.find("zoe: rank 1: "), std::string::npos) << log;
  EXPECT_NE(log.find("budget"), std::string::npos) << log;
}

TEST(RankFailure, AnInputErrorOnEveryRankIsOneLineAndExitTwo) {
  std::string d = make_temp_dir("input");
  std::string out;
  int rc = run_command(kMpirun + "-np 3 " + kZoe + kJob + " --set zoe.model.n_layer=0", &out);
  EXPECT_EQ(rc, 2) << out;
  size_t lines = 0;
  for (size_t at = out.find("zoe: "); at != std::string::npos; at = out.find("zoe: ", at + 1)) ++lines;
  EXPECT_EQ(lines, 1u) << out;
  EXPECT_NE(out.find("zoe.model.n_layer"), std::string::npos) << out;
}

}  // namespace
}  // namespace zoe::test

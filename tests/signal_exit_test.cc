// SignalExit (common/signal_exit.h), in a forked child each, as `zoe` installs it: a signal runs
// the registered cleanups (newest first) and exits 128 + its number with one line; a second one
// kills at once; a SIGBUS in a mapped file that shrank is one line naming the file and exit 1.
#include "common/signal_exit.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "test_util.h"

namespace zoe {
namespace {

namespace fs = std::filesystem;

// Runs `body` in a child whose stderr goes to `log`, after SignalExit::Install(); the child never
// returns into the test.
pid_t fork_child(const std::string& log, const std::function<void()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    SignalExit::Install();
    body();
    _exit(99);
  }
  return pid;
}

// Exit code, or 1000 + the signal that killed it.
int wait_child(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
}

bool wait_for_file(const std::string& path) {
  for (int i = 0; i < 2000 && !fs::exists(path); ++i) usleep(5000);
  return fs::exists(path);
}

void append(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::app) << text; }

TEST(SignalExit, ASignalRunsTheCleanupsAndExitsWith128PlusItsNumber) {
  std::string dir = test::make_temp_dir("signals");
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    const std::string done = dir + "/done" + std::to_string(sig), ready = dir + "/ready" + std::to_string(sig);
    pid_t pid = fork_child(dir + "/log", [&] {
      SignalCleanup first([&] { append(done, "first"); });
      SignalCleanup gone([&] { append(done, "gone "); });
      SignalCleanup second([&] { append(done, "second "); });
      gone.reset();  // unregistered: never runs
      append(ready, "1");
      for (;;) pause();
    });
    ASSERT_TRUE(wait_for_file(ready));
    kill(pid, sig);
    EXPECT_EQ(wait_child(pid), 128 + sig);
    EXPECT_EQ(test::slurp(done), "second first");
    std::string log = test::slurp(dir + "/log");
    EXPECT_NE(log.find(sig == SIGINT ? "zoe: SIGINT: stopping" : "zoe: SIGTERM: stopping"), std::string::npos) << log;
  }
}

// What a thread makes while a signal ends the process is undone, or not made: a directory made
// and then registered in two steps was left behind when the cleanups ran in between (a checkpoint
// save's .tmp under a loaded disk). The maker here makes directories as fast as it can.
TEST(SignalExit, WhatIsMadeWhileTheCleanupsRunIsUndoneOrNotMade) {
  for (int round = 0; round < 5; ++round) {
    std::string dir = test::make_temp_dir("signals");
    const std::string made = dir + "/made";
    ASSERT_EQ(mkdir(made.c_str(), 0700), 0);
    pid_t pid = fork_child(dir + "/log", [&] {
      std::vector<SignalCleanup> held;
      for (int i = 0;; ++i) {
        const std::string d = made + "/" + std::to_string(i);
        auto c = SignalCleanup::Made([&]() -> Result<std::function<void()>> {
          if (mkdir(d.c_str(), 0700) != 0) return Status::Io("mkdir " + d);
          return std::function<void()>([d] { rmdir(d.c_str()); });
        });
        if (!c.ok()) for (;;) pause();  // refused: the process is ending
        held.push_back(std::move(c).value());
        if (i == 100) append(dir + "/ready", "1");
      }
    });
    ASSERT_TRUE(wait_for_file(dir + "/ready"));
    kill(pid, SIGTERM);
    EXPECT_EQ(wait_child(pid), 128 + SIGTERM);
    int left = 0;
    for (auto& e : fs::directory_iterator(made)) left += e.is_directory() ? 1 : 0;
    EXPECT_EQ(left, 0) << "directories made and never undone, round " << round;
  }
}

TEST(SignalExit, ASecondSignalKillsAtOnceEvenWhileACleanupHangs) {
  std::string dir = test::make_temp_dir("signals");
  pid_t pid = fork_child(dir + "/log", [&] {
    SignalCleanup hangs([&] {
      append(dir + "/cleaning", "1");
      for (;;) pause();
    });
    append(dir + "/ready", "1");
    for (;;) pause();
  });
  ASSERT_TRUE(wait_for_file(dir + "/ready"));
  kill(pid, SIGINT);
  ASSERT_TRUE(wait_for_file(dir + "/cleaning"));
  kill(pid, SIGINT);
  EXPECT_EQ(wait_child(pid), 1000 + SIGINT);
}

TEST(SignalExit, AnErrorAlreadyReportedTakesNoSecondLine) {
  std::string dir = test::make_temp_dir("signals");
  pid_t pid = fork_child(dir + "/log", [&] {
    SignalExit::ending();  // as `zoe` does once it printed its error (mpirun then SIGTERMs the ranks)
    append(dir + "/ready", "1");
    for (;;) pause();
  });
  ASSERT_TRUE(wait_for_file(dir + "/ready"));
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_child(pid), 128 + SIGTERM);
  EXPECT_EQ(test::slurp(dir + "/log"), "");
}

// A mapped file cut under the reader: SIGBUS on the next read of a vanished page.
TEST(SignalExit, AMappedFileThatShrankIsOneLineNamingItAndExitOne) {
  std::string dir = test::make_temp_dir("signals");
  const std::string path = dir + "/init.safetensors";
  std::ofstream(path, std::ios::binary) << std::string(1 << 16, 'x');
  pid_t pid = fork_child(dir + "/log", [&] {
    SignalCleanup cleanup([&] { append(dir + "/cleaned", "1"); });
    Result<MappedFile> f = MappedFile::Open(path, "config key 'zoe.init'");
    if (!f.ok() || !f->mapped()) _exit(98);
    if (truncate(path.c_str(), 0) != 0) _exit(97);
    volatile uint8_t sink = f->data()[40000];  // past the new end: SIGBUS
    (void)sink;
    _exit(96);
  });
  EXPECT_EQ(wait_child(pid), 1);
  std::string log = test::slurp(dir + "/log");
  EXPECT_NE(log.find("zoe: " + path + ": the file shrank"), std::string::npos) << log;
  EXPECT_EQ(test::slurp(dir + "/cleaned"), "1");
}

}  // namespace
}  // namespace zoe

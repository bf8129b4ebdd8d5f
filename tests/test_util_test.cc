// The test helpers' own contract: make_temp_dir's folders go with the process that made them, so
// a suite run leaves nothing in $TMPDIR (tools/test.sh fails a pass whose tests leave anything).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_util.h"

namespace zoe::test {
namespace {

// In a forked child: makes a folder with a file in it, sends its path back, exits through exit()
// (atexit runs, as at the end of a test binary's main). Returns the folder's path.
std::string child_makes_a_dir_and_exits(bool keep) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  std::fflush(nullptr);  // the child's exit flushes nothing of ours twice
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (keep) ::setenv("ZOE_KEEP_TEST_DIRS", "1", 1);
    const std::string dir = make_temp_dir("child");
    std::FILE* f = std::fopen((dir + "/a").c_str(), "w");
    if (f) std::fclose(f);
    const bool sent = ::write(fds[1], dir.data(), dir.size()) == static_cast<ssize_t>(dir.size());
    ::close(fds[1]);
    std::exit(sent && f ? 0 : 1);
  }
  ::close(fds[1]);
  std::string dir;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) dir.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  return dir;
}

TEST(TestUtil, TempDirsGoWithTheProcessThatMadeThemAndNoneOfAParentsWithAChild) {
  const std::string mine = make_temp_dir("parent");
  ASSERT_FALSE(mine.empty());
  const std::string child = child_makes_a_dir_and_exits(false);
  ASSERT_FALSE(child.empty());
  EXPECT_FALSE(std::filesystem::exists(child)) << "the child's folder outlived it";
  // The child inherited the list with the parent's folder on it (a death test's fork does).
  EXPECT_TRUE(std::filesystem::is_directory(mine)) << "a child's exit removed its parent's folder";
}

TEST(TestUtil, ZoeKeepTestDirsKeepsThem) {
  const std::string kept = child_makes_a_dir_and_exits(true);
  ASSERT_FALSE(kept.empty());
  EXPECT_TRUE(std::filesystem::exists(kept + "/a"));
  std::filesystem::remove_all(kept);
}

}  // namespace
}  // namespace zoe::test

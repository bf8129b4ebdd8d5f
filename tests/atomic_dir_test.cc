// AtomicDir: directory replacement, and what a crash at each step of commit() leaves.
#include "ckpt/atomic_dir.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/atomic_file.h"
#include "common/checksum.h"
#include "test_util.h"

namespace zoe {
namespace {

namespace fs = std::filesystem;
using test::slurp;
using Step = AtomicDir::Step;

// A toy checkpoint: shard files plus a manifest of their checksums, written last. A directory
// is "complete" when its manifest exists and every checksum verifies (the reader's rule).
Status write_checkpoint(const std::string& dir, const std::string& tag) {
  std::string manifest;
  for (int r = 0; r < 3; ++r) {
    std::string name = "rank" + std::to_string(r) + ".bin";
    std::string body = tag + ": shard " + std::to_string(r) + std::string(1000 * (r + 1), 'a' + r);
    ZOE_RETURN_IF_ERROR(write_file_atomic(dir + "/" + name, body));
    manifest += name + " " + checksum_buffer(body.data(), body.size()) + "\n";
  }
  fs::create_directories(dir + "/sub");
  ZOE_RETURN_IF_ERROR(write_file_atomic(dir + "/sub/tag", tag));
  manifest += "tag " + tag + "\n";
  return write_file_atomic(dir + "/manifest.json", manifest);
}

// The tag of a complete checkpoint in `dir`, or "" when it is absent or incomplete.
std::string complete_tag(const std::string& dir) {
  if (!fs::exists(dir + "/manifest.json")) return "";
  std::istringstream m(slurp(dir + "/manifest.json"));
  std::string name, value, tag;
  while (m >> name >> value) {
    if (name == "tag") {
      tag = value;
      continue;
    }
    Result<std::string> h = checksum_file(dir + "/" + name);
    if (!h.ok() || h.value() != value) return "";
  }
  return slurp(dir + "/sub/tag") == tag ? tag : "";
}

// Entries of `dir` other than `keep`.
std::vector<std::string> others(const std::string& dir, const std::string& keep) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != keep) v.push_back(e.path().filename().string());
  return v;
}

class AtomicDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test::make_temp_dir("atomicdir");
    ASSERT_FALSE(root_.empty());
    ck_ = root_ + "/step_100";
  }
  void TearDown() override { fs::remove_all(root_); }

  void write_version(const std::string& tag, AtomicDir::Options opt = {}) {
    Result<AtomicDir> d = AtomicDir::Create(ck_, std::move(opt));
    ASSERT_TRUE(d.ok()) << d.status().message();
    ASSERT_TRUE(write_checkpoint(d->path(), tag).ok());
    Status s = d->commit();
    ASSERT_TRUE(s.ok()) << s.message();
  }

  // Runs a commit of version "new" over version "old" in a child that is SIGKILLed right after
  // `crash_at`; returns false if the child did not die there.
  bool crash_commit(Step crash_at, bool use_exchange) {
    pid_t child = fork();
    if (child < 0) return false;
    if (child == 0) {
      AtomicDir::Options opt;
      opt.use_exchange = use_exchange;
      opt.after_step = [crash_at](Step s) {
        if (s == crash_at) raise(SIGKILL);
      };
      Result<AtomicDir> d = AtomicDir::Create(ck_, opt);
      if (!d.ok() || !write_checkpoint(d->path(), "new").ok()) _exit(3);
      (void)d->commit();
      _exit(4);  // the step was never reached
    }
    int st = 0;
    if (waitpid(child, &st, 0) != child) return false;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
  }

  std::string root_, ck_;
};

TEST_F(AtomicDirTest, CreateAndReplace) {
  for (bool exchange : {true, false}) {
    fs::remove_all(ck_);
    std::vector<Step> steps;
    write_version("one", {exchange, [&](Step s) { steps.push_back(s); }});
    EXPECT_EQ(complete_tag(ck_), "one");
    EXPECT_EQ(steps, (std::vector<Step>{Step::kSynced, Step::kNewInPlace}));
    steps.clear();
    write_version("two", {exchange, [&](Step s) { steps.push_back(s); }});
    EXPECT_EQ(complete_tag(ck_), "two");
    std::vector<Step> want = {Step::kSynced, Step::kNewInPlace, Step::kOldRemoved};
    if (!exchange) want.insert(want.begin() + 1, Step::kOldMovedAside);
    EXPECT_EQ(steps, want) << "exchange " << exchange;
    EXPECT_TRUE(others(root_, "step_100").empty());
  }
}

TEST_F(AtomicDirTest, NothingUnderFinalNameBeforeCommit) {
  Result<AtomicDir> d = AtomicDir::Create(ck_ + "/");  // trailing slash is fine
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->final_path(), ck_);
  EXPECT_EQ(d->path(), ck_ + ".tmp." + std::to_string(getpid()));
  ASSERT_TRUE(write_checkpoint(d->path(), "x").ok());
  EXPECT_FALSE(fs::exists(ck_));
  d->abort();
  EXPECT_FALSE(fs::exists(d->path()));
  EXPECT_FALSE(d->commit().ok());
  EXPECT_FALSE(fs::exists(ck_));
  {
    Result<AtomicDir> e = AtomicDir::Create(ck_);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE(write_checkpoint(e->path(), "y").ok());
  }  // destroyed uncommitted
  EXPECT_TRUE(others(root_, "").empty());
}

TEST_F(AtomicDirTest, CreatesParents) {
  std::string deep = root_ + "/a/b/step_1";
  Result<AtomicDir> d = AtomicDir::Create(deep);
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_TRUE(write_checkpoint(d->path(), "deep").ok());
  ASSERT_TRUE(d->commit().ok());
  EXPECT_EQ(complete_tag(deep), "deep");
}

TEST_F(AtomicDirTest, RefusesToReplaceAFile) {
  ASSERT_TRUE(write_file_atomic(ck_, "a file").ok());
  Result<AtomicDir> d = AtomicDir::Create(ck_);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(write_checkpoint(d->path(), "x").ok());
  Status s = d->commit();
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find(ck_), std::string::npos);
  EXPECT_EQ(slurp(ck_), "a file");
  EXPECT_TRUE(others(root_, "step_100").empty());
}

// For each step and mode: after the crash, a reader that trusts only a complete directory under
// the final name sees the old or the new version; Recover() (run by the next Create) then leaves
// exactly one complete version and no leftovers.
TEST_F(AtomicDirTest, CrashAtEachStep) {
  struct Case {
    Step step;
    bool exchange;
    const char* seen_right_after;  // complete_tag(ck_) just after the crash
    const char* after_recover;
  };
  const Case cases[] = {
      {Step::kSynced, true, "old", "old"},        {Step::kNewInPlace, true, "new", "new"},
      {Step::kOldRemoved, true, "new", "new"},    {Step::kSynced, false, "old", "old"},
      {Step::kOldMovedAside, false, "", "old"},   {Step::kNewInPlace, false, "new", "new"},
      {Step::kOldRemoved, false, "new", "new"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("step " + std::to_string(static_cast<int>(c.step)) + " exchange " +
                 std::to_string(c.exchange));
    fs::remove_all(root_);
    fs::create_directories(root_);
    write_version("old");
    ASSERT_TRUE(crash_commit(c.step, c.exchange));
    EXPECT_EQ(complete_tag(ck_), c.seen_right_after);
    if (c.step == Step::kOldMovedAside) {
      EXPECT_FALSE(fs::exists(ck_));  // the one gap of mode 2b
    }
    if (c.step != Step::kOldRemoved) {
      EXPECT_FALSE(others(root_, "step_100").empty());
    }
    ASSERT_TRUE(AtomicDir::Recover(ck_).ok());
    EXPECT_EQ(complete_tag(ck_), c.after_recover);
    EXPECT_TRUE(others(root_, "step_100").empty());
    // And the next commit works normally.
    write_version("next");
    EXPECT_EQ(complete_tag(ck_), "next");
  }
}

TEST_F(AtomicDirTest, CrashWhileFillingLeavesOldAndCreateCleansUp) {
  write_version("old");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<AtomicDir> d = AtomicDir::Create(ck_);
    if (!d.ok()) _exit(3);
    std::ofstream(d->path() + "/rank0.bin") << "partial";
    raise(SIGKILL);
    _exit(4);
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(complete_tag(ck_), "old");
  EXPECT_TRUE(fs::exists(ck_ + ".tmp." + std::to_string(child)));
  write_version("new");  // Create() recovers first
  EXPECT_EQ(complete_tag(ck_), "new");
  EXPECT_TRUE(others(root_, "step_100").empty());
}

TEST_F(AtomicDirTest, RecoverLeavesUnrelatedNamesAlone) {
  write_version("old");
  fs::create_directories(root_ + "/step_100.tmp.12x");
  fs::create_directories(root_ + "/step_1000.tmp.5");
  fs::create_directories(root_ + "/step_100.tmp.77");
  ASSERT_TRUE(AtomicDir::Recover(ck_).ok());
  EXPECT_TRUE(fs::exists(root_ + "/step_100.tmp.12x"));
  EXPECT_TRUE(fs::exists(root_ + "/step_1000.tmp.5"));
  EXPECT_FALSE(fs::exists(root_ + "/step_100.tmp.77"));
  EXPECT_EQ(complete_tag(ck_), "old");
}

TEST_F(AtomicDirTest, RecoverWithSeveralOldVersionsAsksForHelp) {
  fs::create_directories(root_ + "/step_100.old.1");
  fs::create_directories(root_ + "/step_100.old.2");
  Status s = AtomicDir::Recover(ck_);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("step_100.old.1"), std::string::npos) << s.message();
  EXPECT_TRUE(fs::exists(root_ + "/step_100.old.1"));
  EXPECT_TRUE(AtomicDir::Recover(root_ + "/absent/dir").ok());
}

}  // namespace
}  // namespace zoe

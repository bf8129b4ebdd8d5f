// What the NVMe store does to files it did not make: a shared nvme_path (say /scratch) may hold
// links, directories of other users and directories named like a dead job's, planted or left
// behind. The store creates, truncates and deletes only what it made itself, never through a link,
// and refuses a directory of its own name that someone else made.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "nvme/nvme_store.h"
#include "test_util.h"

namespace zoe {
namespace {

namespace fs = std::filesystem;

class NvmeFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test::make_temp_dir("nvme-files");
    outside_ = test::make_temp_dir("nvme-victim");  // a user's directory outside nvme_path
    ASSERT_FALSE(root_.empty() || outside_.empty());
    write_file(outside_ + "/weights.swap", "precious");
    write_file(outside_ + "/notes.txt", "also precious");
  }
  void TearDown() override {
    fs::remove_all(root_);
    fs::remove_all(outside_);
  }

  static void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

  NvmeStoreOptions options() const {
    NvmeStoreOptions o;
    o.nvme_path = root_;
    o.job = "test";
    o.block_size = 64 << 10;
    o.queue_depth = 2;
    o.pin_memory = false;
    return o;
  }
  Result<std::unique_ptr<NvmeStore>> open_store(const NvmeStoreOptions& o) {
    return NvmeStore::open(o, std::vector<RegionSpec>{{"master", 100000}});
  }
  void expect_outside_untouched() {
    EXPECT_EQ(test::slurp(outside_ + "/weights.swap"), "precious");
    EXPECT_EQ(test::slurp(outside_ + "/notes.txt"), "also precious");
  }
  // A swap directory as a dead run of `job` would have left it: mode 0700, marker, a swap file.
  std::string dead_job_dir(const std::string& name) {
    const std::string d = root_ + "/" + name;
    EXPECT_EQ(::mkdir(d.c_str(), 0700), 0);
    write_file(d + "/.zoe-lock", "");
    write_file(d + "/master.swap", "stale");
    return d;
  }

  std::string root_, outside_;
};

// The dead-job cleanup follows no link: a link named like a dead job's directory, pointing at a
// directory of *.swap files outside nvme_path, is neither followed nor removed.
TEST_F(NvmeFilesTest, ALinkNamedLikeADeadJobsDirectoryIsNotFollowed) {
  fs::create_directory_symlink(outside_, root_ + "/zoe-12345-rank0");
  auto store = open_store(options());
  ASSERT_TRUE(store.ok()) << store.status().message();
  ASSERT_TRUE(store.value()->close().ok());
  expect_outside_untouched();
  EXPECT_TRUE(fs::is_symlink(root_ + "/zoe-12345-rank0"));
}

// The cleanup removes a dead job's directory only when zoe made it (its marker) and the owner is
// us, and inside it only swap files: a directory without the marker (not zoe's, or one whose
// creator has not locked it yet) and one of another user keep everything.
TEST_F(NvmeFilesTest, TheCleanupRemovesOnlyDirectoriesAndFilesZoeMade) {
  const std::string dead = dead_job_dir("zoe-111-aaaaaaaa-rank0");
  write_file(dead + "/notes.txt", "someone's");
  // Unmarked: made before swap directories carried the marker (old format), or not zoe's at all.
  const std::string unmarked = root_ + "/zoe-222-bbbbbbbb-rank1";  // mode 0755: not one zoe made
  ASSERT_EQ(::mkdir(unmarked.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(unmarked.c_str(), 0755), 0);
  write_file(unmarked + "/master.swap", "not zoe's to judge");
  const std::string mixed = root_ + "/zoe-444-dddddddd-rank0";  // holds a file zoe never makes
  ASSERT_EQ(::mkdir(mixed.c_str(), 0700), 0);
  write_file(mixed + "/master.swap", "not zoe's to judge");
  write_file(mixed + "/notes.txt", "someone's");
  const std::string empty = root_ + "/zoe-555-eeeeeeee-rank0";  // a job between mkdir and its lock
  ASSERT_EQ(::mkdir(empty.c_str(), 0700), 0);
  const std::string old_format = root_ + "/zoe-666-ffffffff-rank0";  // provably zoe's: cleaned
  ASSERT_EQ(::mkdir(old_format.c_str(), 0700), 0);
  write_file(old_format + "/master.swap", "stale");
  write_file(old_format + "/exp_avg.swap", "stale");
  const std::string foreign = dead_job_dir("zoe-333-cccccccc-rank0");
  ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);

  auto store = open_store(options());
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_FALSE(fs::exists(dead + "/master.swap"));
  EXPECT_EQ(test::slurp(dead + "/notes.txt"), "someone's");  // so the directory stays, marked
  EXPECT_EQ(test::slurp(unmarked + "/master.swap"), "not zoe's to judge");
  EXPECT_EQ(test::slurp(mixed + "/master.swap"), "not zoe's to judge");
  EXPECT_EQ(test::slurp(mixed + "/notes.txt"), "someone's");
  EXPECT_TRUE(fs::is_directory(empty));
  EXPECT_FALSE(fs::exists(old_format));  // round 3: old swap directories without a marker stayed forever
  EXPECT_EQ(test::slurp(foreign + "/master.swap"), "stale");

  // With only zoe's files left, the next job removes it all.
  fs::remove(dead + "/notes.txt");
  ASSERT_TRUE(store.value()->close().ok());
  auto again = open_store(options());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_FALSE(fs::exists(dead));
}

// The store's own directory name taken by a link: refused, nothing written through it.
TEST_F(NvmeFilesTest, ALinkInPlaceOfTheStoresDirectoryIsRefused) {
  fs::create_directory_symlink(outside_, root_ + "/zoe-test-rank0");
  auto store = open_store(options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Code::kInvalidInput);
  EXPECT_NE(store.status().message().find(root_ + "/zoe-test-rank0: is a symbolic link"), std::string::npos)
      << store.status().message();
  expect_outside_untouched();
  EXPECT_FALSE(fs::exists(outside_ + "/master.swap"));
  EXPECT_TRUE(fs::is_symlink(root_ + "/zoe-test-rank0"));
}

// A directory of the store's name that another user made (or with a mode other than 0700, or
// without the marker) is refused and left as it is: its owner could plant links in it.
TEST_F(NvmeFilesTest, ADirectoryTheStoreDidNotMakeIsRefused) {
  const std::string d = dead_job_dir("zoe-test-rank0");
  ASSERT_EQ(::chown(d.c_str(), 65534, 65534), 0);
  auto store = open_store(options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Code::kInvalidInput);
  EXPECT_NE(store.status().message().find(d + ": owned by uid 65534 with mode 0700"), std::string::npos)
      << store.status().message();
  EXPECT_EQ(test::slurp(d + "/master.swap"), "stale");

  ASSERT_EQ(::chown(d.c_str(), ::geteuid(), ::getegid()), 0);
  ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
  store = open_store(options());
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("with mode 0755"), std::string::npos) << store.status().message();

  ASSERT_EQ(::chmod(d.c_str(), 0700), 0);
  fs::remove(d + "/.zoe-lock");
  store = open_store(options());
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("was not made by zoe (no .zoe-lock file)"), std::string::npos)
      << store.status().message();
  EXPECT_EQ(test::slurp(d + "/master.swap"), "stale");

  // Its own, left by a dead run: taken over, and its stale swap file replaced.
  write_file(d + "/.zoe-lock", "");
  store = open_store(options());
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_GE(fs::file_size(d + "/master.swap"), 100000u);
}

// A link planted inside the store's directory is never opened: a stale one left by a dead run
// is unlinked itself, and a region whose file name a link took meanwhile is refused (O_EXCL |
// O_NOFOLLOW), the target neither truncated nor written.
TEST_F(NvmeFilesTest, ALinkPlantedInsideTheSwapDirectoryIsNotFollowed) {
  const std::string d = dead_job_dir("zoe-test-rank0");
  fs::remove(d + "/master.swap");
  fs::create_symlink(outside_ + "/weights.swap", d + "/master.swap");
  auto store = open_store(options());
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_FALSE(fs::is_symlink(d + "/master.swap"));
  expect_outside_untouched();

  fs::create_symlink(outside_ + "/weights.swap", d + "/exp_avg.swap");
  Status s = store.value()->add_regions(std::vector<RegionSpec>{{"exp_avg", 4096}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(d + "/exp_avg.swap: exists already"), std::string::npos) << s.message();
  expect_outside_untouched();
  EXPECT_EQ(store.value()->regions(), 1);
  // The planted link is not the store's to remove: its directory stays, and close says so.
  s = store.value()->close();
  EXPECT_NE(s.message().find(d + ": cannot remove the directory (unlinkat): Directory not empty"), std::string::npos)
      << s.message();
  expect_outside_untouched();
  EXPECT_TRUE(fs::is_symlink(d + "/exp_avg.swap"));
  EXPECT_FALSE(fs::exists(d + "/master.swap"));
}

// A store made by another process (or this one) holds its directory: the message names it and
// does not ask for a job name no setting exposes.
TEST_F(NvmeFilesTest, ALockedDirectoryIsNamedWithoutBlamingTheJobName) {
  auto first = open_store(options());
  ASSERT_TRUE(first.ok());
  auto second = open_store(options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kInvalidInput);
  EXPECT_NE(second.status().message().find(root_ + "/zoe-test-rank0: in use by another zoe store"), std::string::npos)
      << second.status().message();
  EXPECT_EQ(second.status().message().find("job name"), std::string::npos) << second.status().message();
}

// nvme_path that is a link is resolved once: the store's directory lies in the real directory.
TEST_F(NvmeFilesTest, ALinkedNvmePathIsResolved) {
  const std::string link = root_ + "-link";
  fs::create_directory_symlink(root_, link);
  NvmeStoreOptions o = options();
  o.nvme_path = link;
  auto store = open_store(o);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_EQ(store.value()->dir(), fs::canonical(root_).string() + "/zoe-test-rank0");
  EXPECT_TRUE(fs::is_directory(root_ + "/zoe-test-rank0"));
  ASSERT_TRUE(store.value()->close().ok());
  fs::remove(link);
}

// What dead jobs left is counted (the swap files' bytes on disk), not removed; a live store's
// files, someone else's, and a directory without the marker count nothing. zoe plan adds it to
// the free space: opening a store there removes it first.
TEST_F(NvmeFilesTest, DeadJobsBytesCountsTheirSwapFilesAndRemovesNothing) {
  auto bytes_or = [](const std::string& path, uint64_t otherwise) {
    Result<uint64_t> r = NvmeStore::dead_jobs_bytes(path);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : otherwise;
  };
  EXPECT_EQ(bytes_or(root_ + "/missing", 1), 0u);
  EXPECT_EQ(bytes_or(root_, 1), 0u);
  const std::string dead = dead_job_dir("zoe-111-aaaaaaaa-rank0");
  write_file(dead + "/exp_avg.swap", std::string(1 << 20, 'x'));
  write_file(dead + "/notes.txt", std::string(1 << 20, 'y'));  // not a swap file: stays, not counted
  const std::string unmarked = root_ + "/zoe-222-bbbbbbbb-rank0";
  ASSERT_EQ(::mkdir(unmarked.c_str(), 0700), 0);
  write_file(unmarked + "/master.swap", std::string(1 << 20, 'z'));
  write_file(unmarked + "/notes.txt", "not zoe's");  // unmarked with other files: not a dead job of zoe's
  auto live = open_store(options());
  ASSERT_TRUE(live.ok()) << live.status().message();  // opening removed the dead job's swap files
  EXPECT_FALSE(fs::exists(dead + "/exp_avg.swap"));
  EXPECT_EQ(bytes_or(root_, 1), 0u);  // the live store's files: not counted
  const std::string again = dead_job_dir("zoe-333-cccccccc-rank0");
  write_file(again + "/exp_avg.swap", std::string(1 << 20, 'x'));
  const uint64_t bytes = bytes_or(root_, 0);
  EXPECT_GE(bytes, uint64_t{1} << 20);
  EXPECT_LT(bytes, uint64_t{2} << 20);  // exp_avg.swap and the 5-byte master.swap, in blocks
  EXPECT_TRUE(fs::exists(again + "/exp_avg.swap"));
  EXPECT_TRUE(fs::exists(unmarked + "/master.swap"));
  ASSERT_TRUE(live.value()->close().ok());
}

// Job names carry random bits besides the pid: two containers whose job has the same pid get two
// directories.
TEST(SwapJobName, APidAndEightHexDigits) {
  EXPECT_EQ(swap_job_name(4242, 0x00ab12cd), "4242-00ab12cd");
  uint32_t a = swap_job_tag(), b = swap_job_tag(), c = swap_job_tag();
  EXPECT_FALSE(a == b && b == c);  // 2^-64 to fail by chance
}

}  // namespace
}  // namespace zoe

// AtomicFile, checksums and the write helpers: contents, crash safety, write errors.
#include "ckpt/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/checksum.h"
#include "common/posix_io.h"
#include "test_util.h"

namespace zoe {
namespace {

namespace fs = std::filesystem;
using test::slurp;

std::string pattern_bytes(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// Files in `dir` whose name starts with `prefix`.
int count_prefixed(const std::string& dir, const std::string& prefix) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  return n;
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("atomic");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(AtomicFileTest, WritesAndReplaces) {
  std::string a = pattern_bytes(100000, 1), b = pattern_bytes(777, 2);
  ASSERT_TRUE(write_file_atomic(p("f"), a).ok());
  EXPECT_EQ(slurp(p("f")), a);
  ASSERT_TRUE(write_file_atomic(p("f"), b).ok());
  EXPECT_EQ(slurp(p("f")), b);
  ASSERT_TRUE(write_file_atomic(p("empty"), "").ok());
  EXPECT_TRUE(fs::exists(p("empty")));
  EXPECT_EQ(fs::file_size(p("empty")), 0u);
  EXPECT_EQ(count_prefixed(dir_, "f.tmp."), 0);
}

TEST_F(AtomicFileTest, StreamingAppendsAndChecksum) {
  std::string data = pattern_bytes(3 << 20, 3);
  Result<AtomicFile> f = AtomicFile::Create(p("s"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  const std::string prefix = p("s") + ".tmp." + std::to_string(getpid()) + ".";
  EXPECT_EQ(f->tmp_path().rfind(prefix, 0), 0u) << f->tmp_path();
  EXPECT_EQ(f->tmp_path().size(), prefix.size() + 16);  // 64 random bits: no name to plant a link at
  EXPECT_TRUE(fs::exists(f->tmp_path()));
  EXPECT_FALSE(fs::exists(p("s")));  // nothing under the final name before commit
  for (size_t off = 0; off < data.size(); off += 1000003)
    ASSERT_TRUE(f->append(data.data() + off, std::min<size_t>(1000003, data.size() - off)).ok());
  EXPECT_EQ(f->bytes_written(), data.size());
  EXPECT_FALSE(fs::exists(p("s")));
  ASSERT_TRUE(f->commit().ok());
  EXPECT_EQ(slurp(p("s")), data);
  EXPECT_FALSE(fs::exists(f->tmp_path()));
  EXPECT_EQ(f->checksum_hex(), checksum_buffer(data.data(), data.size()));
  EXPECT_EQ(checksum_file(p("s")).value(), f->checksum_hex());
  EXPECT_FALSE(f->append("x", 1).ok());  // closed after commit
}

TEST_F(AtomicFileTest, UncommittedFileIsRemoved) {
  ASSERT_TRUE(write_file_atomic(p("keep"), "old").ok());
  {
    Result<AtomicFile> f = AtomicFile::Create(p("keep"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->append("new contents").ok());
  }  // destroyed without commit
  EXPECT_EQ(slurp(p("keep")), "old");
  EXPECT_EQ(count_prefixed(dir_, "keep.tmp."), 0);
  Result<AtomicFile> g = AtomicFile::Create(p("keep"));
  ASSERT_TRUE(g.ok());
  g->abort();
  EXPECT_FALSE(fs::exists(g->tmp_path()));
  EXPECT_FALSE(g->commit().ok());
  EXPECT_EQ(slurp(p("keep")), "old");
}

TEST_F(AtomicFileTest, CrashBeforeCommitLeavesOldFile) {
  std::string old_data = pattern_bytes(5000, 4);
  ASSERT_TRUE(write_file_atomic(p("ck"), old_data).ok());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<AtomicFile> f = AtomicFile::Create(p("ck"));
    if (!f.ok()) _exit(3);
    std::string half = pattern_bytes(2500, 5);
    if (!f->append(half).ok()) _exit(4);
    raise(SIGKILL);  // crash in the middle of writing
    _exit(5);
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "child status " << st;
  EXPECT_EQ(slurp(p("ck")), old_data);  // the final name still holds the old file, intact
  ASSERT_EQ(count_prefixed(dir_, "ck.tmp." + std::to_string(child) + "."), 1);
  std::string stray;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().filename().string().rfind("ck.tmp.", 0) == 0) stray = e.path().string();
  EXPECT_EQ(fs::file_size(stray), 2500u);
  // A later writer is not disturbed by the stray temporary file.
  ASSERT_TRUE(write_file_atomic(p("ck"), "next").ok());
  EXPECT_EQ(slurp(p("ck")), "next");
}

// Round 3 of the hostile-neighbour checks: on main at 8800094 the temporary name was
// "<path>.tmp.<pid>", opened O_CREAT|O_TRUNC and following links, so a link planted there made zoe
// overwrite the link's target; and the final name was renamed over whatever it was.
TEST_F(AtomicFileTest, ALinkPlantedAtEveryPidTempNameIsNotFollowed) {
  ASSERT_TRUE(write_file_atomic(p("victim"), "precious").ok());
  std::string old_style = p("out") + ".tmp." + std::to_string(getpid());
  ASSERT_EQ(symlink(p("victim").c_str(), old_style.c_str()), 0);
  ASSERT_TRUE(write_file_atomic(p("out"), "zoe's output").ok());
  EXPECT_EQ(slurp(p("victim")), "precious");
  EXPECT_EQ(slurp(p("out")), "zoe's output");
  EXPECT_TRUE(fs::is_symlink(old_style));  // not ours: left alone
}

TEST_F(AtomicFileTest, OnlyARegularFileIsReplaced) {
  ASSERT_EQ(mkfifo(p("fifo").c_str(), 0600), 0);
  ASSERT_TRUE(write_file_atomic(p("target"), "target").ok());
  ASSERT_EQ(symlink(p("target").c_str(), p("link").c_str()), 0);
  ASSERT_TRUE(fs::create_directory(p("dir")));
  std::vector<std::string> names = {"fifo", "link", "dir"};
  if (!test::make_device_node(dir_).empty()) names.push_back("null");  // never the system's /dev/null
  for (const std::string& name : names) {
    std::string path = p(name);
    Status s = write_file_atomic(path, "x");
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_EQ(s.code(), Code::kInvalidInput) << s.message();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("replaces only a regular file"), std::string::npos) << s.message();
  }
  struct stat st;
  if (names.size() == 4) {
    ASSERT_EQ(lstat(p("null").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
  }
  ASSERT_EQ(lstat(p("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_TRUE(fs::is_symlink(p("link")));
  EXPECT_EQ(slurp(p("target")), "target");
  EXPECT_EQ(count_prefixed(dir_, "fifo.tmp."), 0);
}

TEST_F(AtomicFileTest, FilesAre0600AndDirectories0700WhateverTheUmask) {
  mode_t old = umask(0);
  Status w = write_file_atomic(p("f"), "x");
  Status d = make_private_dirs(p("a/b/c"));
  umask(old);
  ASSERT_TRUE(w.ok()) << w.message();
  ASSERT_TRUE(d.ok()) << d.message();
  struct stat st;
  ASSERT_EQ(stat(p("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  for (const char* sub : {"a", "a/b", "a/b/c"}) {
    ASSERT_EQ(stat(p(sub).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u) << sub;
  }
}

TEST_F(AtomicFileTest, InputFilesMustBeRegularAndSmallEnough) {
  ASSERT_EQ(mkfifo(p("fifo").c_str(), 0600), 0);
  ASSERT_TRUE(write_file_atomic(p("big"), std::string(100, 'x')).ok());
  ASSERT_EQ(symlink(p("big").c_str(), p("link").c_str()), 0);
  auto fail = [](Result<InputFile> r) { return r.ok() ? std::string() : r.status().message(); };
  // A FIFO would block the open itself; it must come back at once, refused.
  EXPECT_NE(fail(open_input_file(p("fifo"), "test input", 1000)).find("is a FIFO, not a regular file"),
            std::string::npos);
  EXPECT_NE(fail(open_input_file("/dev/zero", "test input", 1000)).find("is a character device"),
            std::string::npos);
  EXPECT_NE(fail(open_input_file(dir_, "test input", 1000)).find("is a directory"), std::string::npos);
  EXPECT_NE(fail(open_input_file(p("big"), "test input", 99)).find("100 bytes, more than the 99"), std::string::npos);
  EXPECT_NE(fail(open_input_file(p("link"), "test input", 1000, Links::kRefuse)).find("symbolic link"),
            std::string::npos);
  Result<InputFile> ok = open_input_file(p("link"), "test input", 100);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->size, 100u);
  char c;
  EXPECT_EQ(read(ok->fd.get(), &c, 1), 1);
}

TEST_F(AtomicFileTest, DevFullIsIoWithStrerror) {
  int fd = open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "/dev/full is not available here";
  std::string data(1 << 16, 'z');
  Status s = write_all(fd, data.data(), data.size(), "/dev/full");
  close(fd);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find("/dev/full"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(errno_string(ENOSPC)), std::string::npos) << s.message();
}

TEST_F(AtomicFileTest, WriteErrorLeavesOldFileAndNoTemporary) {
  // A file-size limit makes the kernel cut a write short and then fail it with EFBIG, the way a
  // full disk cuts it short and fails with ENOSPC. Run in a child so the limit stays there.
  ASSERT_TRUE(write_file_atomic(p("big"), "old").ok());
  std::string msg_path = p("msg");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {10000, 10000};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
    std::string data = pattern_bytes(1 << 20, 6);
    Status s = write_file_atomic(p("big"), data);
    std::ofstream out(msg_path);
    out << static_cast<int>(s.code()) << "\n" << s.message();
    out.close();  // _exit() skips destructors
    _exit(out.good() ? 0 : 4);
  }
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  std::string msg = slurp(msg_path);
  EXPECT_EQ(msg.substr(0, msg.find('\n')), std::to_string(static_cast<int>(Code::kIo))) << msg;
  EXPECT_NE(msg.find(p("big") + ".tmp."), std::string::npos) << msg;
  EXPECT_NE(msg.find(errno_string(EFBIG)), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 10000 of 1048576 bytes"), std::string::npos) << msg;
  EXPECT_EQ(slurp(p("big")), "old");
  EXPECT_EQ(count_prefixed(dir_, "big.tmp."), 0);
}

TEST_F(AtomicFileTest, FailedAppendSticks) {
  Result<AtomicFile> f = AtomicFile::Create(p("x"));
  ASSERT_TRUE(f.ok());
  // Replace the descriptor's target with /dev/full so the next write fails with ENOSPC.
  int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (full < 0) GTEST_SKIP() << "/dev/full is not available here";
  std::string tmp = f->tmp_path();
  // Find our temporary file's descriptor: the newest one below `full`.
  int fd = -1;
  for (int i = full - 1; i >= 0 && fd < 0; --i) {
    char link[64], target[4096];
    std::snprintf(link, sizeof(link), "/proc/self/fd/%d", i);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n > 0 && std::string(target, n) == tmp) fd = i;
  }
  ASSERT_GE(fd, 0);
  ASSERT_EQ(dup2(full, fd), fd);
  close(full);
  Status s = f->append("data that cannot be written");
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find(errno_string(ENOSPC)), std::string::npos) << s.message();
  EXPECT_EQ(f->commit().message(), s.message());
  EXPECT_FALSE(fs::exists(p("x")));
  EXPECT_FALSE(fs::exists(tmp));
}

TEST_F(AtomicFileTest, BadPaths) {
  Result<AtomicFile> f = AtomicFile::Create(p("no/such/dir/file"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kInvalidInput);
  EXPECT_NE(f.status().message().find(p("no/such/dir/file")), std::string::npos);
  EXPECT_FALSE(AtomicFile::Create("").ok());
  EXPECT_FALSE(AtomicFile::Create(p("dir/")).ok());
}

TEST(Checksum, KnownValuesAndStreaming) {
  EXPECT_EQ(checksum_buffer("", 0), "2d06800538d394c2");  // XXH3_64bits of no input
  EXPECT_EQ(checksum_buffer("abc", 3), "78af5f94892f3950");
  EXPECT_EQ(Checksum::checksum_to_hex(0xab), "00000000000000ab");
  std::string data = pattern_bytes(1 << 20, 7);
  Checksum c;
  for (size_t off = 0, step = 1; off < data.size(); off += step, step = step * 3 + 1)
    c.update(data.data() + off, std::min(step, data.size() - off));
  EXPECT_EQ(c.hex(), checksum_buffer(data.data(), data.size()));
  std::string other = data;
  other[12345] ^= 1;
  EXPECT_NE(checksum_buffer(other.data(), other.size()), c.hex());
  c.reset();  // a fresh stream on the same state
  c.update("ab", 2);
  c.update("c", 1);
  EXPECT_EQ(c.hex(), "78af5f94892f3950");
}

TEST(Checksum, FilesAcrossChunkBoundaries) {
  std::string dir = test::make_temp_dir("cksum");
  for (size_t n : {size_t{0}, size_t{1}, size_t{8} << 20, (size_t{8} << 20) + 123}) {
    std::string data = pattern_bytes(n, 8);
    std::string path = dir + "/f" + std::to_string(n);
    ASSERT_TRUE(write_file_atomic(path, data).ok());
    Result<std::string> h = checksum_file(path);
    ASSERT_TRUE(h.ok()) << h.status().message();
    EXPECT_EQ(h.value(), checksum_buffer(data.data(), data.size())) << n;
    EXPECT_EQ(h->size(), 16u);
  }
  Result<std::string> missing = checksum_file(dir + "/missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir + "/missing"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zoe

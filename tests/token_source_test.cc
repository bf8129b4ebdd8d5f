// TokenSource: the bytes and llm.c formats, globbing, and every bad-data case.
#include "data/token_source.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "test_util.h"

namespace zoe {
namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// An llm.c shard; header fields and the file length can be overridden to make bad ones.
std::string llmc_bytes(const std::vector<uint16_t>& toks, int32_t magic = 20240520,
                       int32_t version = 1, int64_t ntok_field = -1) {
  std::vector<int32_t> hdr(256, 0);
  hdr[0] = magic;
  hdr[1] = version;
  hdr[2] = static_cast<int32_t>(ntok_field >= 0 ? ntok_field : static_cast<int64_t>(toks.size()));
  std::string s(reinterpret_cast<const char*>(hdr.data()), 1024);
  s.append(reinterpret_cast<const char*>(toks.data()), toks.size() * 2);
  return s;
}

class TokenSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("tokens");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string p(const std::string& name) const { return dir_ + "/" + name; }

  // Expects Open to fail with Invalid and a message containing every fragment.
  void expect_error(TokenFormat f, const std::string& pattern, int64_t vocab,
                    std::vector<std::string> fragments) {
    Result<TokenSource> r = TokenSource::Open(f, pattern, vocab);
    ASSERT_FALSE(r.ok()) << pattern;
    EXPECT_EQ(r.status().code(), Code::kInvalidInput) << r.status().message();
    for (const auto& frag : fragments)
      EXPECT_NE(r.status().message().find(frag), std::string::npos)
          << "message '" << r.status().message() << "' lacks '" << frag << "'";
  }

  std::string dir_;
};

TEST_F(TokenSourceTest, FormatNames) {
  EXPECT_EQ(parse_token_format("bytes").value(), TokenFormat::kBytes);
  EXPECT_EQ(parse_token_format("llmc").value(), TokenFormat::kLlmc);
  Result<TokenFormat> bad = parse_token_format("gpt2");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidInput);
  EXPECT_NE(bad.status().message().find("gpt2"), std::string::npos);
  EXPECT_EQ(token_format_name(TokenFormat::kLlmc), "llmc");
}

TEST_F(TokenSourceTest, BytesEveryByteIsAToken) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(255 - i));
  all += "tail";
  write_bytes(p("bin"), all);
  Result<TokenSource> r = TokenSource::Open(TokenFormat::kBytes, p("bin"), 256);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const TokenSource& s = r.value();
  ASSERT_EQ(s.num_shards(), 1u);
  EXPECT_EQ(s.shard_path(0), p("bin"));
  ASSERT_EQ(s.total_tokens(), all.size());
  std::vector<int32_t> t(all.size());
  ASSERT_TRUE(s.copy(0, 0, t.size(), t.data()).ok());
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_EQ(t[i], static_cast<uint8_t>(all[i])) << i;
  EXPECT_EQ(s.token(0, 0).value(), 255);
  EXPECT_EQ(s.token(0, 256).value(), 't');
}

TEST_F(TokenSourceTest, BytesTokenNotBelowVocab) {
  write_bytes(p("text"), "abcabczabc");
  expect_error(TokenFormat::kBytes, p("text"), 'c' + 1,
               {p("text"), "byte 122", "position 6", "vocab_size 100"});
  EXPECT_TRUE(TokenSource::Open(TokenFormat::kBytes, p("text"), 'z' + 1).ok());
}

TEST_F(TokenSourceTest, BytesEmptyFileAndMissingFile) {
  write_bytes(p("empty"), "");
  expect_error(TokenFormat::kBytes, p("empty"), 256, {p("empty"), "empty file"});
  expect_error(TokenFormat::kBytes, p("nothing"), 256, {p("nothing"), "no files match"});
  expect_error(TokenFormat::kBytes, dir_, 256, {dir_, "directory"});
  expect_error(TokenFormat::kBytes, p("x"), 0, {"vocab_size"});
}

TEST_F(TokenSourceTest, ShippedCorpusLoadsAsAscii) {
  std::string corpus = std::string(ZOE_SOURCE_DIR) + "/data/corpus.txt";
  Result<TokenSource> r = TokenSource::Open(TokenFormat::kBytes, corpus, 128);  // 7-bit ASCII
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GT(r->total_tokens(), 400u * 1000);
  EXPECT_LT(r->total_tokens(), 700u * 1000);
  std::vector<int32_t> head(9);
  ASSERT_TRUE(r->copy(0, 0, head.size(), head.data()).ok());
  EXPECT_EQ(std::string(head.begin(), head.end()), "Genesis 1");
}

// Round 3: on main at 8800094 tokens were checked once and then read through the mapping, so a
// file rewritten in place reached the model with ids past the vocabulary (out-of-bounds reads and
// writes in the encoder and the loss), and a truncated one was SIGBUS.
TEST_F(TokenSourceTest, AFileRewrittenInPlaceAfterOpenIsAnErrorWhereTheTokenIsRead) {
  write_bytes(p("llmc"), llmc_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  Result<TokenSource> r = TokenSource::Open(TokenFormat::kLlmc, p("llmc"), 100);
  ASSERT_TRUE(r.ok()) << r.status().message();
  {  // rewrite token 5 in place (same inode, same size) with an id past the vocabulary
    std::fstream f(p("llmc"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024 + 2 * 5);
    const char big[2] = {char(0x50), char(0xc3)};  // 50000
    f.write(big, 2);
  }
  std::vector<int32_t> t(8, -1);
  ASSERT_TRUE(r->copy(0, 0, 5, t.data()).ok());  // the tokens before it are still good
  Status s = r->copy(0, 0, 8, t.data());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("token 50000 at position 5 is not below vocab_size 100"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(p("llmc")), std::string::npos) << s.message();
}

TEST_F(TokenSourceTest, AFileTruncatedAfterOpenIsAnIoErrorNotASigbus) {
  write_bytes(p("bin"), std::string(100000, 'a'));
  Result<TokenSource> r = TokenSource::Open(TokenFormat::kBytes, p("bin"), 256);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::filesystem::resize_file(p("bin"), 10);
  std::vector<int32_t> t(1000);
  ASSERT_TRUE(r->copy(0, 0, 10, t.data()).ok());
  Status s = r->copy(0, 50000, t.size(), t.data());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIo);
  EXPECT_NE(s.message().find("data file changed while the job ran"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(p("bin")), std::string::npos) << s.message();
}

// A data set of many shards (llm.c's fineweb has hundreds) holds one descriptor while it is read,
// not one per shard: 300 shards under a limit of 64 descriptors.
TEST_F(TokenSourceTest, ManyShardsHoldOneDescriptor) {
  for (int i = 0; i < 300; ++i) write_bytes(p("s" + std::to_string(1000 + i)), std::string(10, char('a' + i % 20)));
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  Result<TokenSource> r = TokenSource::Open(TokenFormat::kBytes, p("s*"), 256);
  std::string bad;
  for (size_t i = 0; r.ok() && i < r->num_shards() && bad.empty(); ++i) {
    Result<int32_t> t = r->token(i, 9);
    if (!t.ok() || t.value() != 'a' + int(i % 20)) bad = "shard " + std::to_string(i) + ": " + t.status().message();
  }
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_shards(), 300u);
  EXPECT_EQ(bad, "");
}

TEST_F(TokenSourceTest, FifosAndDevicesAreRefusedAtOnce) {
  ASSERT_EQ(mkfifo(p("fifo").c_str(), 0600), 0);
  expect_error(TokenFormat::kBytes, p("fifo"), 256, {p("fifo"), "is a FIFO, not a regular file"});
  expect_error(TokenFormat::kBytes, "/dev/zero", 256, {"/dev/zero", "is a character device"});
  ASSERT_EQ(symlink("/dev/zero", p("zero").c_str()), 0);
  expect_error(TokenFormat::kLlmc, p("zero"), 256, {p("zero"), "is a character device"});
}

TEST_F(TokenSourceTest, MappedFileReadsFilesThatCannotBeMapped) {
  // /proc files report size 0 but have contents: read, not mapped.
  Result<MappedFile> f = MappedFile::Open("/proc/self/status");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_FALSE(f->mapped());
  ASSERT_GT(f->size(), 0u);
  EXPECT_EQ(std::memcmp(f->data(), "Name:", 5), 0);
  write_bytes(p("reg"), "regular");
  Result<MappedFile> g = MappedFile::Open(p("reg"));
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->mapped());
  MappedFile moved = std::move(g.value());
  ASSERT_EQ(moved.size(), 7u);
  EXPECT_EQ(std::memcmp(moved.data(), "regular", 7), 0);
}

TEST_F(TokenSourceTest, LlmcRoundTripAndUint16Range) {
  std::vector<uint16_t> toks = {0, 1, 50256, 65535, 7, 300};
  write_bytes(p("a.bin"), llmc_bytes(toks));
  Result<TokenSource> r = TokenSource::Open(TokenFormat::kLlmc, p("a.bin"), 65536);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->total_tokens(), toks.size());
  std::vector<int32_t> t(toks.size());
  ASSERT_TRUE(r->copy(0, 0, t.size(), t.data()).ok());
  for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(t[i], toks[i]);
  EXPECT_EQ(r->token(0, 3).value(), 65535);
}

TEST_F(TokenSourceTest, LlmcGlobReadsShardsInSortedOrder) {
  write_bytes(p("train_010.bin"), llmc_bytes({10, 10}));
  write_bytes(p("train_002.bin"), llmc_bytes({2}));
  write_bytes(p("train_001.bin"), llmc_bytes({1, 1, 1}));
  write_bytes(p("val_000.bin"), llmc_bytes({99}));
  Result<TokenSource> r = TokenSource::Open(TokenFormat::kLlmc, p("train_*.bin"), 50257);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->num_shards(), 3u);
  EXPECT_EQ(r->shard_path(0), p("train_001.bin"));
  EXPECT_EQ(r->shard_path(1), p("train_002.bin"));
  EXPECT_EQ(r->shard_path(2), p("train_010.bin"));
  EXPECT_EQ(r->shard_tokens(0), 3u);
  EXPECT_EQ(r->shard_tokens(1), 1u);
  EXPECT_EQ(r->shard_tokens(2), 2u);
  EXPECT_EQ(r->total_tokens(), 6u);
  EXPECT_EQ(r->token(2, 1).value(), 10);
  // An existing path is taken literally even when it looks like a glob.
  write_bytes(p("odd[1].bin"), llmc_bytes({5}));
  Result<TokenSource> lit = TokenSource::Open(TokenFormat::kLlmc, p("odd[1].bin"), 50257);
  ASSERT_TRUE(lit.ok()) << lit.status().message();
  EXPECT_EQ(lit->token(0, 0).value(), 5);
}

TEST_F(TokenSourceTest, LlmcNoMatch) {
  expect_error(TokenFormat::kLlmc, p("train_*.bin"), 50257, {p("train_*.bin"), "no files match"});
}

TEST_F(TokenSourceTest, LlmcWrongMagic) {
  write_bytes(p("m.bin"), llmc_bytes({1, 2}, 20240521));
  expect_error(TokenFormat::kLlmc, p("m.bin"), 50257, {p("m.bin"), "magic", "20240521", "expected 20240520"});
  // A text file read as llmc fails on the magic too.
  write_bytes(p("t.bin"), std::string(2048, 'a'));
  expect_error(TokenFormat::kLlmc, p("t.bin"), 50257, {p("t.bin"), "magic"});
}

TEST_F(TokenSourceTest, LlmcWrongVersion) {
  write_bytes(p("v.bin"), llmc_bytes({1, 2}, 20240520, 2));
  expect_error(TokenFormat::kLlmc, p("v.bin"), 50257, {p("v.bin"), "version 2", "expected 1"});
}

TEST_F(TokenSourceTest, LlmcSizeMismatch) {
  std::string good = llmc_bytes({1, 2, 3, 4});
  write_bytes(p("trunc.bin"), good.substr(0, good.size() - 3));
  expect_error(TokenFormat::kLlmc, p("trunc.bin"), 50257,
               {p("trunc.bin"), "1029 bytes", "expected 1032", "truncated"});
  write_bytes(p("long.bin"), good + "xx");
  expect_error(TokenFormat::kLlmc, p("long.bin"), 50257, {p("long.bin"), "1034 bytes", "expected 1032"});
  write_bytes(p("count.bin"), llmc_bytes({1, 2, 3, 4}, 20240520, 1, 5));
  expect_error(TokenFormat::kLlmc, p("count.bin"), 50257, {p("count.bin"), "expected 1034"});
  write_bytes(p("neg.bin"), llmc_bytes({1, 2}, 20240520, 1, 0xffffffffLL));
  expect_error(TokenFormat::kLlmc, p("neg.bin"), 50257, {p("neg.bin"), "negative token count -1"});
}

TEST_F(TokenSourceTest, LlmcShortAndEmptyFiles) {
  write_bytes(p("short.bin"), llmc_bytes({}).substr(0, 100));
  expect_error(TokenFormat::kLlmc, p("short.bin"), 50257, {p("short.bin"), "100 bytes", "1024-byte"});
  write_bytes(p("empty.bin"), "");
  expect_error(TokenFormat::kLlmc, p("empty.bin"), 50257, {p("empty.bin"), "empty file"});
  write_bytes(p("zero.bin"), llmc_bytes({}));
  expect_error(TokenFormat::kLlmc, p("zero.bin"), 50257, {p("zero.bin"), "no tokens"});
}

TEST_F(TokenSourceTest, LlmcTokenNotBelowVocab) {
  std::vector<uint16_t> toks(100, 7);
  toks[42] = 50257;
  write_bytes(p("s_0.bin"), llmc_bytes({1, 2}));
  write_bytes(p("s_1.bin"), llmc_bytes(toks));
  expect_error(TokenFormat::kLlmc, p("s_*.bin"), 50257,
               {p("s_1.bin"), "token 50257", "position 42", "byte offset 1108", "vocab_size 50257"});
  EXPECT_TRUE(TokenSource::Open(TokenFormat::kLlmc, p("s_*.bin"), 50258).ok());
}

TEST_F(TokenSourceTest, OneBadShardFailsTheWholeGlob) {
  write_bytes(p("s_0.bin"), llmc_bytes({1, 2}));
  write_bytes(p("s_1.bin"), llmc_bytes({1, 2}, 1234));
  expect_error(TokenFormat::kLlmc, p("s_*.bin"), 50257, {p("s_1.bin"), "magic 1234"});
}

}  // namespace
}  // namespace zoe

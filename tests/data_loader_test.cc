// DataLoader: llm.c's batching order exactly, ranks, shard switching, state save/restore.
#include "data/data_loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace zoe {
namespace {

void write_llmc(const std::string& path, const std::vector<uint16_t>& toks) {
  std::vector<int32_t> hdr(256, 0);
  hdr[0] = 20240520;
  hdr[1] = 1;
  hdr[2] = static_cast<int32_t>(toks.size());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(hdr.data()), 1024);
  f.write(reinterpret_cast<const char*>(toks.data()), static_cast<std::streamsize>(toks.size() * 2));
  ASSERT_TRUE(f.good()) << path;
}

// llm.c's dataloader (dataloader_next_batch / dataloader_advance_ / dataloader_load_batch,
// no shuffling), written the way llm.c counts: samples per shard, not token positions.
struct LlmcReference {
  std::vector<std::vector<uint16_t>> shards;
  size_t B, T, rank, world;
  size_t shard = 0, sample = 0;
  void next(std::vector<int32_t>* in, std::vector<int32_t>* tgt) {
    size_t total_batch = world * B * T;
    size_t num_samples = (shards[shard].size() - 1) / total_batch;
    if (sample >= num_samples) {
      if (shard == shards.size() - 1) shard = 0; else shard = (shard + 1) % shards.size();
      sample = 0;
    }
    size_t off = sample * total_batch + rank * B * T;
    in->assign(B * T, 0);
    tgt->assign(B * T, 0);
    for (size_t i = 0; i < B * T; ++i) {
      (*in)[i] = shards[shard][off + i];
      (*tgt)[i] = shards[shard][off + i + 1];
    }
    sample += 1;
  }
};

class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("loader");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Shards named shard_000.bin ... with distinct tokens, opened as one source.
  TokenSource make_source(const std::vector<std::vector<uint16_t>>& shards) {
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[32];
      std::snprintf(name, sizeof(name), "/shard_%03zu.bin", i);
      write_llmc(dir_ + name, shards[i]);
    }
    Result<TokenSource> r = TokenSource::Open(TokenFormat::kLlmc, dir_ + "/shard_*.bin", 50257);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }

  static std::vector<uint16_t> ramp(uint16_t first, size_t n) {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(first + i);
    return v;
  }

  std::string dir_;
};

std::vector<int32_t> range(int32_t first, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

TEST_F(DataLoaderTest, HandWrittenOrderTwoRanks) {
  // One 20-token shard 100..119, B=1, T=4, 2 ranks: a global batch is 8 tokens and
  // (20 - 1) / 8 = 2 of them fit, so the third batch starts the shard over.
  TokenSource src = make_source({ramp(100, 20)});
  Result<DataLoader> r0 = DataLoader::Create(src, 1, 4, 0, 2);
  Result<DataLoader> r1 = DataLoader::Create(src, 1, 4, 1, 2);
  ASSERT_TRUE(r0.ok() && r1.ok());
  std::vector<int32_t> in(4), tgt(4);
  const int32_t want0[] = {100, 108, 100, 108};
  const int32_t want1[] = {104, 112, 104, 112};
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(r0->next_batch(in.data(), tgt.data()).ok());
    EXPECT_EQ(in, range(want0[step], 4)) << "rank 0 step " << step;
    EXPECT_EQ(tgt, range(want0[step] + 1, 4)) << "rank 0 step " << step;
    ASSERT_TRUE(r1->next_batch(in.data(), tgt.data()).ok());
    EXPECT_EQ(in, range(want1[step], 4)) << "rank 1 step " << step;
    EXPECT_EQ(tgt, range(want1[step] + 1, 4)) << "rank 1 step " << step;
  }
}

TEST_F(DataLoaderTest, HandWrittenShardSwitch) {
  // Shards of 13 and 9 tokens, B=2, T=2, one rank: batches of 5 tokens every 4.
  // Shard 0 fits (13 - 1) / 4 = 3 batches (at 0, 4, 8), shard 1 fits 2 (at 0, 4), then wrap.
  TokenSource src = make_source({ramp(0, 13), ramp(1000, 9)});
  Result<DataLoader> d = DataLoader::Create(src, 2, 2, 0, 1);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const int32_t starts[] = {0, 4, 8, 1000, 1004, 0, 4};
  std::vector<int32_t> in(4), tgt(4);
  for (int32_t s : starts) {
    ASSERT_TRUE(d->next_batch(in.data(), tgt.data()).ok());
    EXPECT_EQ(in, range(s, 4)) << "batch starting at token " << s;
    EXPECT_EQ(tgt, range(s + 1, 4)) << "batch starting at token " << s;
  }
}

TEST_F(DataLoaderTest, MatchesLlmcReferenceAcrossShardsRanksAndEpochs) {
  std::vector<std::vector<uint16_t>> shards = {ramp(0, 101), ramp(2000, 64), ramp(5000, 250),
                                               ramp(9000, 49)};
  TokenSource src = make_source(shards);
  for (size_t world : {1, 2, 3}) {
    for (size_t rank = 0; rank < world; ++rank) {
      const size_t B = 2, T = 8;
      Result<DataLoader> d = DataLoader::Create(src, B, T, static_cast<int>(rank),
                                                static_cast<int>(world));
      ASSERT_TRUE(d.ok()) << d.status().message();
      LlmcReference ref{shards, B, T, rank, world};
      std::vector<int32_t> in(B * T), tgt(B * T), rin, rtgt;
      for (int step = 0; step < 60; ++step) {  // several epochs
        ASSERT_TRUE(d->next_batch(in.data(), tgt.data()).ok());
        ref.next(&rin, &rtgt);
        ASSERT_EQ(in, rin) << "world " << world << " rank " << rank << " step " << step;
        ASSERT_EQ(tgt, rtgt) << "world " << world << " rank " << rank << " step " << step;
      }
    }
  }
}

TEST_F(DataLoaderTest, RanksReadDisjointAdjacentSlices) {
  TokenSource src = make_source({ramp(0, 300), ramp(1000, 200)});
  const int world = 3, B = 2, T = 5;
  std::vector<DataLoader> loaders;
  for (int r = 0; r < world; ++r) loaders.push_back(DataLoader::Create(src, B, T, r, world).value());
  std::vector<int32_t> in(B * T), tgt(B * T);
  for (int step = 0; step < 40; ++step) {
    std::vector<int32_t> global;
    std::set<int32_t> seen;
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(loaders[r].next_batch(in.data(), tgt.data()).ok());
      for (int32_t t : in) EXPECT_TRUE(seen.insert(t).second) << "token " << t << " read twice";
      global.insert(global.end(), in.begin(), in.end());
    }
    // Together the ranks read one contiguous run of world*B*T tokens.
    ASSERT_EQ(global.size(), size_t{world * B * T});
    for (size_t i = 1; i < global.size(); ++i) EXPECT_EQ(global[i], global[0] + int32_t(i)) << step;
    for (int r = 1; r < world; ++r) EXPECT_EQ(loaders[r].state(), loaders[0].state());
  }
}

TEST_F(DataLoaderTest, StateSaveAndRestore) {
  TokenSource src = make_source({ramp(0, 70), ramp(3000, 90), ramp(7000, 40)});
  Result<DataLoader> a = DataLoader::Create(src, 3, 4, 1, 2);
  ASSERT_TRUE(a.ok());
  std::vector<int32_t> in(12), tgt(12);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(a->next_batch(in.data(), tgt.data()).ok());
  DataLoaderState saved = a->state();
  std::vector<std::vector<int32_t>> after;
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(a->next_batch(in.data(), tgt.data()).ok());
    after.push_back(in);
  }
  Result<DataLoader> b = DataLoader::Create(src, 3, 4, 1, 2);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b->restore(saved).ok());
  EXPECT_EQ(b->state(), saved);
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(b->next_batch(in.data(), tgt.data()).ok());
    EXPECT_EQ(in, after[i]) << "batch " << i << " after restore";
  }
  b->reset();
  EXPECT_EQ(b->state(), DataLoaderState{});
  ASSERT_TRUE(b->next_batch(in.data(), tgt.data()).ok());
  EXPECT_EQ(in, range(12, 12));  // rank 1's first batch

  Status s = b->restore({3, 0});
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("shard 3"), std::string::npos) << s.message();
  s = b->restore({2, 41});
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("position 41"), std::string::npos) << s.message();
  EXPECT_TRUE(b->restore({2, 40}).ok());  // at the end: the next batch moves to shard 0
  ASSERT_TRUE(b->next_batch(in.data(), tgt.data()).ok());
  EXPECT_EQ(b->state(), (DataLoaderState{0, 24}));
  EXPECT_EQ(in, range(12, 12));
}

TEST_F(DataLoaderTest, TooShortForOneBatchSaysHowManyTokens) {
  TokenSource src = make_source({ramp(0, 100), ramp(500, 32)});
  // B=2, T=4, 4 ranks: 33 tokens needed per shard; the second shard has 32.
  Result<DataLoader> d = DataLoader::Create(src, 2, 4, 0, 4);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kInvalidInput);
  EXPECT_NE(d.status().message().find("shard_001.bin"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("32 tokens"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("33"), std::string::npos) << d.status().message();
  // With 32 + 1 tokens it fits exactly once.
  EXPECT_TRUE(DataLoader::Create(src, 1, 31, 0, 1).ok());
  EXPECT_FALSE(DataLoader::Create(src, 1, 32, 0, 1).ok());
}

TEST_F(DataLoaderTest, RejectsBadGeometry) {
  TokenSource src = make_source({ramp(0, 100)});
  EXPECT_EQ(DataLoader::Create(src, 0, 4, 0, 1).status().code(), Code::kInvalidInput);
  EXPECT_EQ(DataLoader::Create(src, 2, 0, 0, 1).status().code(), Code::kInvalidInput);
  EXPECT_EQ(DataLoader::Create(src, 2, 4, 2, 2).status().code(), Code::kInvalidInput);
  EXPECT_EQ(DataLoader::Create(src, 2, 4, -1, 2).status().code(), Code::kInvalidInput);
  EXPECT_EQ(DataLoader::Create(src, 2, 4, 0, 0).status().code(), Code::kInvalidInput);
}

TEST_F(DataLoaderTest, BytesSourceBatches) {
  std::string path = dir_ + "/text.txt";
  std::ofstream(path) << "hello, world! this is text.";
  Result<TokenSource> src = TokenSource::Open(TokenFormat::kBytes, path, 256);
  ASSERT_TRUE(src.ok());
  Result<DataLoader> d = DataLoader::Create(src.value(), 1, 5, 0, 1);
  ASSERT_TRUE(d.ok());
  std::vector<int32_t> in(5), tgt(5);
  ASSERT_TRUE(d->next_batch(in.data(), tgt.data()).ok());
  EXPECT_EQ(std::string(in.begin(), in.end()), "hello");
  EXPECT_EQ(std::string(tgt.begin(), tgt.end()), "ello,");
  ASSERT_TRUE(d->next_batch(in.data(), tgt.data()).ok());
  EXPECT_EQ(std::string(in.begin(), in.end()), ", wor");
}

}  // namespace
}  // namespace zoe

// Checkpoints through the C API: zoe_load, its resume, checks a checkpoint's data checksums
// whatever zoe.checksums (the swap blocks' key) says, only zoe.checkpoint.verify=false skips them;
// zoe_save locks the root it writes to for the engine's life.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "zoe/zoe.h"

namespace {

namespace fs = std::filesystem;

constexpr int64_t kD = 4;
const DLDataType kF32{kDLFloat, 32, 1};

zoe_engine* one_unit(const std::string& zoe_keys) {
  std::string config = zoe::test::on_test_device("{\"zero_optimization\": {\"stage\": 1}, \"optimizer\": {\"type\": \"AdamW\", "
                                      "\"params\": {\"lr\": 0.01}}, \"zoe\": {" + zoe_keys + "}}");
  zoe_engine* e = nullptr;
  EXPECT_EQ(zoe_engine_new(config.c_str(), &e), ZOE_OK) << zoe_last_error();
  int64_t w[2] = {kD, kD};
  EXPECT_EQ(zoe_register_param(e, "a", "a.w", 2, w, kF32, 1), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(zoe_start(e), ZOE_OK) << zoe_last_error();
  return e;
}

TEST(CApiCheckpoint, ZoeLoadRefusesACorruptRankFileWithSwapChecksumsOff) {
  std::string dir = zoe::test::make_temp_dir("capi_ckpt");
  zoe_engine* e = one_unit("\"checksums\": false");
  ASSERT_EQ(zoe_save(e, (dir + "/ckpt").c_str()), ZOE_OK) << zoe_last_error();
  zoe_engine_free(e);
  std::string rank_file = dir + "/ckpt/step_00000000/rank_00000.bin";
  ASSERT_TRUE(fs::exists(rank_file));
  {
    std::fstream f(rank_file, std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(8);
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(8);
    f.write(&c, 1);
  }
  zoe_engine* f = one_unit("\"checksums\": false");
  EXPECT_EQ(zoe_load(f, (dir + "/ckpt").c_str()), ZOE_ERR_CORRUPT);
  EXPECT_NE(std::string(zoe_last_error()).find("rank_00000.bin fails its xxh3 checksum"), std::string::npos)
      << zoe_last_error();
  zoe_engine_free(f);
  zoe_engine* g = one_unit("\"checksums\": false, \"checkpoint\": {\"verify\": false}");
  EXPECT_EQ(zoe_load(g, (dir + "/ckpt").c_str()), ZOE_OK) << zoe_last_error();
  zoe_engine_free(g);
  fs::remove_all(dir);
}

TEST(CApiCheckpoint, ASecondEngineSavingToTheSameRootIsRefusedWhileTheFirstLives) {
  std::string dir = zoe::test::make_temp_dir("capi_ckpt");
  zoe_engine* first = one_unit("");
  zoe_engine* second = one_unit("");
  ASSERT_EQ(zoe_save(first, (dir + "/ckpt").c_str()), ZOE_OK) << zoe_last_error();
  EXPECT_EQ(zoe_save(second, (dir + "/ckpt").c_str()), ZOE_ERR_INVALID);
  EXPECT_NE(std::string(zoe_last_error()).find("in use by another job (pid " + std::to_string(getpid())),
            std::string::npos) << zoe_last_error();
  EXPECT_EQ(zoe_save(second, (dir + "/other").c_str()), ZOE_OK) << zoe_last_error();
  zoe_engine_free(first);  // its lock goes with it
  EXPECT_EQ(zoe_save(second, (dir + "/ckpt").c_str()), ZOE_OK) << zoe_last_error();
  zoe_engine_free(second);
  fs::remove_all(dir);
}

}  // namespace

namespace {

// Round 3: on main at 8800094 zoe_export renamed its output over whatever the path named (a
// device node became a regular file) and wrote through a link planted at "<out>.tmp.<pid>".
TEST(CApiCheckpoint, ZoeExportReplacesOnlyARegularFileAndFollowsNoPlantedLink) {
  std::string dir = zoe::test::make_temp_dir("capi_export");
  zoe_engine* e = one_unit("");
  std::ofstream(dir + "/precious") << "mine";
  fs::create_symlink(dir + "/precious", dir + "/w.safetensors.tmp." + std::to_string(getpid()));
  fs::create_symlink(dir + "/precious", dir + "/link.safetensors");
  std::vector<std::string> outs = {dir + "/link.safetensors"};
  const std::string node = zoe::test::make_device_node(dir);  // never the system's /dev/null
  if (!node.empty()) outs.push_back(node);
  for (const std::string& out : outs) {
    EXPECT_EQ(zoe_export(e, out.c_str()), ZOE_ERR_INVALID) << out;
    EXPECT_NE(std::string(zoe_last_error()).find("replaces only a regular file"), std::string::npos)
        << zoe_last_error();
  }
  ASSERT_EQ(zoe_export(e, (dir + "/w.safetensors").c_str()), ZOE_OK) << zoe_last_error();
  zoe_engine_free(e);
  // transformers' from_pretrained refuses a safetensors file without {"format": "pt"} (issue 45).
  std::string file = zoe::test::slurp(dir + "/w.safetensors");
  ASSERT_GT(file.size(), 8u);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  std::string header = file.substr(8, header_bytes);
  EXPECT_NE(header.find("\"__metadata__\":{\"format\":\"pt\"}"), std::string::npos) << header;
  EXPECT_NE(header.find("\"a.w\":{\"dtype\":\"F32\",\"shape\":[4,4]"), std::string::npos) << header;
  EXPECT_EQ(zoe::test::slurp(dir + "/precious"), "mine");
  if (!node.empty()) {
    EXPECT_TRUE(fs::is_character_file(fs::symlink_status(node)));
  }
  EXPECT_TRUE(fs::is_symlink(dir + "/link.safetensors"));
  EXPECT_GT(fs::file_size(dir + "/w.safetensors"), 0u);
  fs::remove_all(dir);
}

}  // namespace

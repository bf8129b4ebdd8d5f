// The checkpoint manifest validator: a hostile manifest.json is refused with one error naming the
// field, never used. Each case is one field a user (or a disk) could get wrong.
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "ckpt/manifest.h"

namespace zoe::test {
namespace {

using json = nlohmann::json;

// Two units over three ranks: unit "a" has 10 elements (chunks of 4: 4, 4, 2), "b" 2 (1, 1, 0).
CheckpointManifest valid() {
  CheckpointManifest m;
  m.world_size = 3;
  m.stage = 3;
  m.config = json::object();
  m.units = {{"a", 10, {{"a.w", {2, 4}, 0, 8}, {"a.b", {2}, 8, 2}}}, {"b", 2, {{"b.x", {2}, 0, 2}}}};
  std::vector<uint64_t> bytes = manifest_file_bytes(m.units, 3);
  for (int r = 0; r < 3; ++r) m.files.push_back({manifest_rank_file_name(r), bytes[r], "0123456789abcdef"});
  m.train_state.steps_done = 7;
  m.train_state.steps_applied = 6;
  m.train_state.loss_scale = 65536;
  return m;
}

TEST(Manifest, RoundTripsAndSizesFollowTheLayout) {
  CheckpointManifest m = valid();
  EXPECT_EQ(m.files[0].bytes, 3u * 4 * (4 + 1));
  EXPECT_EQ(m.files[2].bytes, 3u * 4 * 2);
  auto back = parse_manifest(manifest_to_text(m), "d");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->units.size(), 2u);
  EXPECT_EQ(back->units[0].tensors[1].offset, 8);
  EXPECT_EQ(back->files[1].name, "rank_00001.bin");
  EXPECT_EQ(back->train_state.steps_applied, 6);
  EXPECT_EQ(back->train_state.loss_scale, 65536);
}

TEST(Manifest, FileSizesInOnePassEqualEachRanksOwnedElements) {
  std::vector<ManifestUnit> units;
  for (int64_t n : {1, 2, 3, 7, 10, 64, 65, 1000, 1333}) units.push_back({"u" + std::to_string(n), n, {}});
  for (int world = 1; world <= 9; ++world) {
    std::vector<uint64_t> bytes = manifest_file_bytes(units, world);
    ASSERT_EQ(bytes.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      uint64_t floats = 0;
      for (const ManifestUnit& u : units) floats += 3 * manifest_owned(u.numel, world, r);
      EXPECT_EQ(bytes[r], 4 * floats) << "world " << world << " rank " << r;
    }
  }
}

TEST(Manifest, EveryHostileFieldIsRefusedByName) {
  struct Case {
    const char* what;
    std::function<void(json&)> damage;
    const char* needle;  // in the error message
  } cases[] = {
      {"tensor offset 1e9", [](json& j) { j["units"][0]["tensors"][1]["offset"] = 1000000000; },
       "units[0].tensors[1].offset"},
      {"offset + numel past the unit", [](json& j) { j["units"][0]["tensors"][1]["offset"] = 9; },
       "units[0].tensors[1].offset"},
      {"negative shape", [](json& j) { j["units"][0]["tensors"][0]["shape"] = {-2, 4}; }, "units[0].tensors[0].shape"},
      {"numel 1e15", [](json& j) { j["units"][0]["tensors"][0]["shape"] = {1000000000000000}; },
       "units[0].tensors[0].shape"},
      {"shape overflowing 64 bits", [](json& j) { j["units"][0]["tensors"][0]["shape"] = {1 << 30, 1 << 30, 1 << 30}; },
       "units[0].tensors[0].shape"},
      {"negative unit numel", [](json& j) { j["units"][1]["numel"] = -5; }, "units[1].numel"},
      {"file name leaving the directory", [](json& j) { j["files"][1]["name"] = "../../something"; }, "files[1].name"},
      {"absolute file name", [](json& j) { j["files"][0]["name"] = "/etc/passwd"; }, "files[0].name"},
      {"file size not the layout's", [](json& j) { j["files"][2]["bytes"] = 4; }, "files[2].bytes"},
      {"checksum not hex", [](json& j) { j["files"][0]["xxh3"] = "zz"; }, "files[0].xxh3"},
      {"fewer files than ranks", [](json& j) { j["files"].erase(2); }, "2 files listed for world size 3"},
      {"negative step", [](json& j) { j["step"] = -5; }, "'step'"},
      {"negative steps_applied", [](json& j) { j["steps_applied"] = -100; }, "'steps_applied'"},
      {"more applied steps than steps", [](json& j) { j["steps_applied"] = 8; }, "'steps_applied'"},
      {"negative loss scale", [](json& j) { j["train_state"]["loss_scale"] = -1; }, "train_state.loss_scale"},
      {"zero loss scale", [](json& j) { j["train_state"]["loss_scale"] = 0; }, "train_state.loss_scale"},
      {"string loss scale", [](json& j) { j["train_state"]["loss_scale"] = "1"; }, "train_state.loss_scale"},
      {"negative data position", [](json& j) { j["train_state"]["data_position"] = -1; },
       "train_state.data_position"},
      {"data position past any data", [](json& j) { j["train_state"]["data_position"] = int64_t{1} << 62; },
       "train_state.data_position"},
      {"data shard past any data", [](json& j) { j["train_state"]["data_shard"] = int64_t{1} << 62; },
       "train_state.data_shard"},
      // a.w is [0, 8): a.b moved to 6 shares a.w's last two elements.
      {"overlapping tensors", [](json& j) { j["units"][0]["tensors"][1]["offset"] = 6; }, "overlaps tensor 'a.w'"},
      {"overlapping tensors, the first one moved", [](json& j) { j["units"][0]["tensors"][0]["offset"] = 1; },
       "tensor 'a.b' at [8, 10) overlaps tensor 'a.w' at [1, 9)"},
      // A checksum is no signature: an old format's manifest is validated alike.
      {"overlapping tensors, format 1", [](json& j) { j["format_version"] = 1; j["units"][0]["tensors"][1]["offset"] = 0; },
       "overlaps tensor"},
      {"negative hysteresis", [](json& j) { j["train_state"]["scaler_hysteresis"] = -1; },
       "train_state.scaler_hysteresis"},
      {"world size 0", [](json& j) { j["world_size"] = 0; }, "'world_size'"},
      {"stage 7", [](json& j) { j["stage"] = 7; }, "'stage'"},
      {"huge unsigned step", [](json& j) { j["step"] = uint64_t{1} << 63; }, "'step'"},
      {"future format", [](json& j) { j["format_version"] = 99; }, "'format_version'"},
      {"other format", [](json& j) { j["format"] = "torch"; }, "'format'"},
      {"duplicate tensor name", [](json& j) { j["units"][1]["tensors"][0]["name"] = "a.w"; }, "appears twice"},
      {"units not an array", [](json& j) { j["units"] = 3; }, "'units'"},
      {"no units", [](json& j) { j["units"] = json::array(); }, "at least one unit"},
      {"tensor not an object", [](json& j) { j["units"][0]["tensors"][0] = 1; }, "units[0].tensors[0]"},
      {"missing train_state", [](json& j) { j.erase("train_state"); }, "'train_state'"},
  };
  json good = json::parse(manifest_to_text(valid()));
  for (const Case& c : cases) {
    json j = good;
    c.damage(j);
    auto r = parse_manifest(j.dump(), "ckdir");
    ASSERT_FALSE(r.ok()) << c.what << " was accepted";
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << c.what;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << c.what << ": " << r.status().message();
    EXPECT_NE(r.status().message().find("checkpoint 'ckdir'"), std::string::npos) << c.what;
    EXPECT_NE(r.status().message().find("manifest.json"), std::string::npos) << c.what;
  }
}

TEST(Manifest, EmptyTensorsAndAdjacentTensorsDoNotOverlap) {
  json j = json::parse(manifest_to_text(valid()));
  j["units"][0]["tensors"].push_back({{"name", "a.empty"}, {"shape", {0}}, {"offset", 3}});  // inside a.w, no element
  auto r = parse_manifest(j.dump(), "ckdir");
  EXPECT_TRUE(r.ok()) << r.status().message();
}

TEST(Manifest, NotJsonIsRefused) {
  for (const char* text : {"", "{", "[1,2]", "null", "{\"format_version\": 1"}) {
    auto r = parse_manifest(text, "d");
    EXPECT_FALSE(r.ok()) << text;
  }
}

TEST(Manifest, DivergedLossIsNull) {
  CheckpointManifest m = valid();
  m.train_state.last_loss = std::nan("");
  auto back = parse_manifest(manifest_to_text(m), "d");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(std::isnan(back->train_state.last_loss));
}

// Copying and dumping the config recurse per level (fuzz_manifest overflowed the stack at 12000).
TEST(Manifest, DeeplyNestedJsonIsRefused) {
  json j = json::parse(manifest_to_text(valid()));
  json deep = 1;
  for (int i = 0; i < 70; ++i) deep = json{{"a", deep}};
  j["config"] = deep;
  auto r = parse_manifest(j.dump(), "d");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("deeper than 64"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace zoe::test

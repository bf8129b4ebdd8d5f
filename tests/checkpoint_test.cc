// Checkpoints through the zoe binary: exact resume, resume on another rank count, refusal of
// damaged checkpoints, and survival of a kill -9 during save.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <algorithm>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "common/checksum.h"
#include "ckpt/safetensors_reader.h"
#include "test_util.h"

namespace zoe::test {
namespace {

namespace fs = std::filesystem;

// fp32 so that "bitwise" is meaningful; a small MLP.
const std::string kBase =
    " train --quiet --set zoe.device=" + test_device_name() + " --set zoe.model.type=mlp --set bf16.enabled=false --set zoe.model.n_layer=3 --set zoe.model.n_embd=48"
    " --set train_micro_batch_size_per_gpu=4 --set zoe.checkpoint.dir='\"\"'";  // none unless a test sets one

std::string run_ok(const std::string& cmd) {
  std::string out;
  int rc = run_command(cmd, &out);
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  return out;
}

std::vector<double> losses(const std::string& report) {
  std::vector<double> l;
  std::ifstream f(report);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

std::vector<char> exported_bytes(const std::string& ckpt_root, const std::string& out) {
  run_ok(kZoe + " export --checkpoint " + ckpt_root + " --out " + out);
  auto r = SafetensorsReader::Open(out);
  EXPECT_TRUE(r.ok());
  std::vector<char> all;
  for (auto& t : r->tensors()) {
    const char* p = reinterpret_cast<const char*>(r->data(t));
    all.insert(all.end(), p, p + t.nbytes());
  }
  return all;
}

class CheckpointTest : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointTest, TenStepsEqualFivePlusResumePlusFiveBitwise) {
  int stage = GetParam();
  std::string d = make_temp_dir("ckpt");
  std::string common = kBase + " --set zero_optimization.stage=" + std::to_string(stage);
  std::string np2 = kMpirun + "-np 2 " + kZoe;
  run_ok(np2 + common + " --set zoe.steps=10 --set zoe.checkpoint.dir='\"" + d + "/a\"' --report " + d + "/a.jsonl");
  run_ok(np2 + common + " --set zoe.steps=5 --set zoe.checkpoint.dir='\"" + d + "/b\"' --report " + d + "/b1.jsonl");
  std::string out = run_ok(np2 + " train --set zoe.steps=10" + common.substr(6) + " --set zoe.checkpoint.dir='\"" + d +
                           "/b\"' --report " + d + "/b2.jsonl");
  auto a = losses(d + "/a.jsonl"), b1 = losses(d + "/b1.jsonl"), b2 = losses(d + "/b2.jsonl");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b1.size(), 5u);
  ASSERT_EQ(b2.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a[i], b1[i]) << i;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a[5 + i], b2[i]) << "step " << 6 + i;
  EXPECT_EQ(exported_bytes(d + "/a", d + "/a.st"), exported_bytes(d + "/b", d + "/b.st"));
}

INSTANTIATE_TEST_SUITE_P(Stages, CheckpointTest, ::testing::Values(0, 3));

// SIGKILL to a child, reaped; whether the kill ended it (false: it had exited by itself).
bool kill_and_reap(pid_t pid) {
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFSIGNALED(st);
}

TEST(Checkpoint, SavedWithTwoRanksResumesWithThree) {
  // The same global batch (6 micro-batches a step) split 2x3 and 3x2.
  std::string d = make_temp_dir("ckpt");
  std::string two = kMpirun + "-np 2 " + kZoe + kBase + " --set gradient_accumulation_steps=3";
  std::string three = kMpirun + "-np 3 " + kZoe + kBase + " --set gradient_accumulation_steps=2";
  run_ok(two + " --set zero_optimization.stage=2 --set zoe.steps=8 --report " + d + "/ref.jsonl");
  run_ok(two + " --set zero_optimization.stage=2 --set zoe.steps=4 --set zoe.checkpoint.dir='\"" + d + "/c\"'");
  run_ok(three + " --set zero_optimization.stage=3 --set zoe.steps=8 --set zoe.checkpoint.dir='\"" + d +
         "/c\"' --report " + d + "/resumed.jsonl");
  auto ref = losses(d + "/ref.jsonl"), res = losses(d + "/resumed.jsonl");
  ASSERT_EQ(ref.size(), 8u);
  ASSERT_EQ(res.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(res[i], ref[4 + i], 1e-6 * std::abs(ref[4 + i])) << "step " << 5 + i;
}

// Optimizer state half on NVMe, and at stage 3 the parameters too.
std::string nvme_offload(const std::string& dir) {
  std::string p = "'\"" + dir + "\"'";
  return " --set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path=" +
         p + " --set zero_optimization.offload_optimizer.ratio=0.5 --set zero_optimization.offload_param.device=nvme"
         " --set zero_optimization.offload_param.nvme_path=" + p + " --set aio.block_size=4096";
}

TEST(Checkpoint, StateOnNvmeSavesResumesAndExportsAsInMemory) {
  std::string d = make_temp_dir("ckpt");
  std::string np2 = kMpirun + "-np 2 " + kZoe, np3 = kMpirun + "-np 3 " + kZoe;
  std::string common = kBase + " --set zero_optimization.stage=3";
  auto dir = [&](const char* name) { return " --set zoe.checkpoint.dir='\"" + d + "/" + name + "\"'"; };
  run_ok(np2 + common + " --set zoe.steps=10" + dir("mem") + " --report " + d + "/mem.jsonl");
  run_ok(np2 + common + nvme_offload(d + "/swap") + " --set zoe.steps=5" + dir("nv") + " --report " + d + "/nv.jsonl");
  run_ok(np2 + common + nvme_offload(d + "/swap") + " --set zoe.steps=10" + dir("nv") + " --report " + d + "/nv.jsonl");
  auto mem = losses(d + "/mem.jsonl"), nv = losses(d + "/nv.jsonl");
  ASSERT_EQ(mem.size(), 10u);
  ASSERT_EQ(nv.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(mem[i], nv[i]) << "step " << i + 1;
  EXPECT_EQ(exported_bytes(d + "/mem", d + "/mem.st"), exported_bytes(d + "/nv", d + "/nv.st"));
  // The NVMe-homed checkpoint resumes on three ranks at stage 2, state again on NVMe.
  run_ok(np2 + common + " --set gradient_accumulation_steps=3 --set zoe.steps=4" + nvme_offload(d + "/swap2") + dir("c"));
  std::string out = run_ok(np3 + kBase + " --set zero_optimization.stage=2 --set gradient_accumulation_steps=2"
                           " --set zero_optimization.offload_optimizer.device=nvme"
                           " --set zero_optimization.offload_optimizer.nvme_path='\"" + d + "/swap3\"'"
                           " --set zoe.steps=6" + dir("c") + " --report " + d + "/three.jsonl");
  EXPECT_EQ(losses(d + "/three.jsonl").size(), 2u) << out;
  // No swap file outlives its run.
  for (const char* p : {"/swap", "/swap2", "/swap3"})
    for (auto& e : fs::recursive_directory_iterator(d + p)) EXPECT_FALSE(e.is_regular_file()) << e.path();
}

void flip_byte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(at);
  f.write(&c, 1);
}

// A checkpoint after 2 steps, `cmd` resuming from it, and a pristine copy to restore between cases.
struct SavedCheckpoint {
  std::string d = make_temp_dir("ckpt");
  std::string cmd = kZoe + kBase + " --set zoe.checkpoint.dir='\"" + d + "/c\"'";
  std::string ck = d + "/c/step_00000002";
  SavedCheckpoint() {
    run_ok(cmd + " --set zoe.steps=2");
    fs::copy(ck, d + "/pristine", fs::copy_options::recursive);
  }
  void restore() const {
    fs::remove_all(ck);
    fs::copy(d + "/pristine", ck, fs::copy_options::recursive);
  }
};

TEST(Checkpoint, DamagedCheckpointsAreRefusedWithAClearError) {
  SavedCheckpoint saved;
  const std::string &cmd = saved.cmd, &ck = saved.ck;
  struct Case {
    std::function<void()> damage;
    std::string needle;
  } cases[] = {
      {[&] { flip_byte(ck + "/rank_00000.bin", 100); }, "checksum"},
      {[&] { fs::resize_file(ck + "/rank_00000.bin", 64); }, "truncated"},
      {[&] { fs::remove(ck + "/rank_00000.bin"); }, "missing"},
      {[&] { fs::remove(ck + "/manifest.xxh3"); }, "manifest.xxh3 is missing"},
      {[&] { std::ofstream(ck + "/manifest.json") << "{\"format_version\": 1"; }, "manifest.json fails the checksum"},
  };
  for (auto& c : cases) {
    saved.restore();
    c.damage();
    std::string out;
    int rc = run_command(cmd + " --set zoe.steps=3", &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find(c.needle), std::string::npos) << out;
    EXPECT_NE(out.find("step_00000002"), std::string::npos) << out;
  }
}

// Round 3: on main at 8800094 with rank 1's file corrupt, rank 0's line was only "another rank
// failed to load it": no file, no cause. The line the user reads names the file and the reason.
TEST(Checkpoint, ARankFileThatFailsToLoadIsNamedOnEveryRanksLine) {
  std::string d = make_temp_dir("ckpt");
  std::string np2 = kMpirun + "-np 2 " + kZoe + kBase + " --set zoe.checkpoint.dir='\"" + d + "\"'";
  run_ok(np2 + " --set zoe.steps=2 --set zoe.checkpoint.every=2");
  flip_byte(d + "/step_00000002/rank_00001.bin", 10);
  std::string out;
  int rc = run_command(np2 + " --set zoe.steps=3", &out);
  EXPECT_EQ(rc, 2) << out;
  // Input errors are printed once, by rank 0 (cli/train_command.cc): that line says it all.
  std::string rank0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("zoe: rank 0: ", 0) == 0) rank0 = line;
  EXPECT_NE(rank0.find("another rank failed to load it; rank 1: "), std::string::npos) << out;
  EXPECT_NE(rank0.find("file rank_00001.bin fails its xxh3 checksum"), std::string::npos) << out;
}

// Rewrites a checkpoint's manifest through `edit` and keeps its checksum right, so that what is
// tested is the validation of the values, not the checksum.
void edit_manifest(const std::string& ck, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json m = nlohmann::json::parse(slurp(ck + "/manifest.json"));
  edit(m);
  std::string text = m.dump(2) + "\n";
  std::ofstream(ck + "/manifest.json", std::ios::trunc) << text;
  std::ofstream(ck + "/manifest.xxh3", std::ios::trunc) << checksum_buffer(text.data(), text.size()) << "\n";
}

TEST(Checkpoint, HostileManifestsAreExitTwoForExportAndResume) {
  SavedCheckpoint saved;
  const std::string &cmd = saved.cmd, &ck = saved.ck, &d = saved.d;
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string field;
  } cases[] = {
      {[](nlohmann::json& m) { m["units"][0]["tensors"][0]["offset"] = 1000000000; }, "units[0].tensors[0].offset"},
      {[](nlohmann::json& m) { m["units"][0]["tensors"][0]["shape"][0] = -3; }, "units[0].tensors[0].shape"},
      {[](nlohmann::json& m) { m["units"][0]["tensors"][0]["shape"] = {1000000000000000}; }, "units[0].tensors[0].shape"},
      {[](nlohmann::json& m) { m["files"][0]["name"] = "../../something"; }, "files[0].name"},
      {[](nlohmann::json& m) { m["step"] = -5; }, "'step'"},
      {[](nlohmann::json& m) { m["steps_applied"] = -100; }, "'steps_applied'"},
      {[](nlohmann::json& m) { m["train_state"]["loss_scale"] = -1; }, "train_state.loss_scale"},
      // The bias moved onto the weight's first elements: both would read the same values.
      {[](nlohmann::json& m) { m["units"][0]["tensors"][1]["offset"] = 0; }, "overlaps tensor"},
      {[](nlohmann::json& m) { m["train_state"]["data_position"] = int64_t{1} << 62; }, "train_state.data_position"},
  };
  for (auto& c : cases)
    for (bool format1 : {false, true}) {  // format 1 has no manifest.xxh3, and is validated alike
      saved.restore();
      edit_manifest(ck, c.edit);
      if (format1) {
        edit_manifest(ck, [](nlohmann::json& m) { m["format_version"] = 1; });
        fs::remove(ck + "/manifest.xxh3");
      }
      for (const std::string& run : {cmd + " --set zoe.steps=3", kZoe + " export --checkpoint " + ck + " --out " + d + "/x.st"}) {
        std::string out;
        int rc = run_command(run, &out);
        EXPECT_EQ(rc, 2) << run << "\n" << out;
        EXPECT_NE(out.find(c.field), std::string::npos) << out;
        EXPECT_NE(out.find("manifest.json"), std::string::npos) << out;
      }
    }
}

TEST(Checkpoint, SwapChecksumsOffStillVerifiesTheCheckpoint) {
  SavedCheckpoint saved;
  flip_byte(saved.ck + "/rank_00000.bin", 100);
  std::string out;
  // zoe.checksums is about swap blocks: a corrupt checkpoint is still refused, by resume and export.
  int rc = run_command(saved.cmd + " --set zoe.checksums=false --set zoe.steps=3", &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("rank_00000.bin fails its xxh3 checksum"), std::string::npos) << out;
  out.clear();
  rc = run_command(kZoe + " export --checkpoint " + saved.ck + " --out " + saved.d + "/x.st", &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("rank_00000.bin fails its xxh3 checksum"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(saved.d + "/x.st"));
  // Only the checkpoint's own key skips the check, deliberately.
  out.clear();
  rc = run_command(saved.cmd + " --set zoe.checkpoint.verify=false --set zoe.steps=3", &out);
  EXPECT_EQ(rc, 0) << out;
}

// A valid format-2 manifest (stage 3, step 1) of these units and rank files, and its checksum.
void write_stage3_manifest(const std::string& ck, int ranks, const nlohmann::json& units, const nlohmann::json& files) {
  nlohmann::json m = {{"format", "zoe-checkpoint"}, {"format_version", 2}, {"step", 1}, {"steps_applied", 1},
                      {"world_size", ranks}, {"stage", 3}, {"config", nlohmann::json::object()}, {"units", units},
                      {"files", files},
                      {"train_state", {{"loss_scale", 1.0}, {"scaler_good_steps", 0}, {"scaler_hysteresis", 0},
                                       {"data_position", 0}, {"data_shard", 0}, {"last_loss", 1.0}}}};
  std::string text = m.dump() + "\n";
  std::ofstream(ck + "/manifest.json", std::ios::trunc) << text;
  std::ofstream(ck + "/manifest.xxh3", std::ios::trunc) << checksum_buffer(text.data(), text.size()) << "\n";
}

TEST(Checkpoint, ExportReadsEachRanksChunkOfEachUnitAtItsOffset) {
  // Units of 1, 2, 5 and 7 elements over 3 ranks: full chunks, remainders and ranks that own
  // nothing of a unit. Element e of unit u has master value 100u + e; the moments are negative.
  const int ranks = 3;
  std::vector<int64_t> numels = {1, 2, 5, 7};
  std::string ck = make_temp_dir("ckpt") + "/step_00000001";
  fs::create_directories(ck);
  nlohmann::json units = nlohmann::json::array(), files = nlohmann::json::array();
  std::vector<std::string> data(ranks);
  for (size_t u = 0; u < numels.size(); ++u) {
    int64_t n = numels[u], c = (n + ranks - 1) / ranks;
    // Two tensors per unit, the second starting mid-unit (on another rank's chunk).
    units.push_back({{"name", "u" + std::to_string(u)}, {"numel", n},
                     {"tensors", {{{"name", fmt::format("t{}a", u)}, {"shape", {n / 2}}, {"offset", 0}},
                                  {{"name", fmt::format("t{}b", u)}, {"shape", {n - n / 2}}, {"offset", n / 2}}}}});
    for (int r = 0; r < ranks; ++r)
      for (float sign : {1.f, -1.f, -2.f})
        for (int64_t e = r * c; e < std::min(n, (r + 1) * c); ++e) {
          float v = sign * static_cast<float>(100 * u + e);
          data[r].append(reinterpret_cast<const char*>(&v), 4);
        }
  }
  for (int r = 0; r < ranks; ++r) {
    std::string name = fmt::format("rank_{:05d}.bin", r);
    std::ofstream(ck + "/" + name, std::ios::binary) << data[r];
    files.push_back({{"name", name}, {"bytes", data[r].size()}, {"xxh3", checksum_buffer(data[r].data(), data[r].size())}});
  }
  write_stage3_manifest(ck, ranks, units, files);
  run_ok(kZoe + " export --checkpoint " + ck + " --out " + ck + ".st");
  auto st = SafetensorsReader::Open(ck + ".st");
  ASSERT_TRUE(st.ok()) << st.status().message();
  ASSERT_EQ(st->tensors().size(), 2 * numels.size());
  for (size_t u = 0; u < numels.size(); ++u)
    for (int half = 0; half < 2; ++half) {
      const auto& t = st->tensors()[2 * u + half];
      int64_t first = half ? numels[u] / 2 : 0;
      const float* v = reinterpret_cast<const float*>(st->data(t));
      for (uint64_t e = 0; e < t.numel; ++e)
        EXPECT_EQ(v[e], static_cast<float>(100 * u + first + e)) << t.name << "[" << e << "]";
    }
}

// Round 3 (left open by round 2): export kept every rank file it read open, so a checkpoint of
// more ranks than the descriptor limit was EMFILE. 300 ranks, each owning one element of each of
// two units, exported under `ulimit -n 48`.
TEST(Checkpoint, ExportOfMoreRankFilesThanDescriptorsSucceeds) {
  const int ranks = 300;
  std::string ck = make_temp_dir("ckpt") + "/step_00000001";
  fs::create_directories(ck);
  nlohmann::json units = nlohmann::json::array(), files = nlohmann::json::array();
  for (int u = 0; u < 2; ++u)
    units.push_back({{"name", fmt::format("u{}", u)}, {"numel", ranks},
                     {"tensors", {{{"name", fmt::format("t{}", u)}, {"shape", {ranks}}, {"offset", 0}}}}});
  for (int r = 0; r < ranks; ++r) {
    std::string data;
    for (int u = 0; u < 2; ++u)
      for (float sign : {1.f, -1.f, -2.f}) {
        float v = sign * static_cast<float>(1000 * u + r);
        data.append(reinterpret_cast<const char*>(&v), 4);
      }
    std::string name = fmt::format("rank_{:05d}.bin", r);
    std::ofstream(ck + "/" + name, std::ios::binary) << data;
    files.push_back({{"name", name}, {"bytes", data.size()}, {"xxh3", checksum_buffer(data.data(), data.size())}});
  }
  write_stage3_manifest(ck, ranks, units, files);
  run_ok("ulimit -n 48; " + kZoe + " export --checkpoint " + ck + " --out " + ck + ".st");
  auto st = SafetensorsReader::Open(ck + ".st");
  ASSERT_TRUE(st.ok()) << st.status().message();
  for (int u = 0; u < 2; ++u) {
    const float* v = reinterpret_cast<const float*>(st->data(st->tensors()[u]));
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(v[r], static_cast<float>(1000 * u + r)) << u << " " << r;
  }
}

// A manifest with `ranks` rank files and `units` one-element units: rank 0's file holds every
// unit, the others are empty. Valid in every field; only its size is hostile.
void write_wide_checkpoint(const std::string& ck, int ranks, int units, bool good_checksums) {
  fs::create_directories(ck);
  nlohmann::json u = nlohmann::json::array(), files = nlohmann::json::array();
  for (int i = 0; i < units; ++i) u.push_back({{"name", "u" + std::to_string(i)}, {"numel", 1}, {"tensors", nlohmann::json::array()}});
  std::string data(size_t{12} * units, '\0');
  std::ofstream(ck + "/rank_00000.bin", std::ios::binary) << data;
  for (int r = 0; r < ranks; ++r) {
    std::string name = fmt::format("rank_{:05d}.bin", r);
    if (r > 0) std::ofstream(ck + "/" + name, std::ios::binary).flush();
    std::string sum = r == 0 ? checksum_buffer(data.data(), data.size()) : checksum_buffer("", 0);
    if (r == 0 && !good_checksums) sum = std::string(16, '0');
    files.push_back({{"name", name}, {"bytes", r == 0 ? data.size() : 0}, {"xxh3", sum}});
  }
  write_stage3_manifest(ck, ranks, u, files);
}

TEST(Checkpoint, ExportOfManyRanksTimesManyUnitsRunsInBoundedMemory) {
  if (kAddressSanitizer) GTEST_SKIP() << "ulimit -v and AddressSanitizer's shadow memory do not mix";
  // 30000 x 30000 entries of a per-rank, per-unit table would be 7 GB; zoe gets 1.5 GB of
  // address space (ulimit -v) and must answer from what the files hold.
  std::string d = make_temp_dir("ckpt");
  const std::string limit = "ulimit -v 1500000; ";
  write_wide_checkpoint(d + "/bad", 30000, 30000, /*good_checksums=*/false);
  std::string out;
  int rc = run_command(limit + kZoe + " export --checkpoint " + d + "/bad --out " + d + "/x.st", &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("rank_00000.bin fails its xxh3 checksum"), std::string::npos) << out;
  write_wide_checkpoint(d + "/good", 30000, 30000, /*good_checksums=*/true);
  out.clear();
  rc = run_command(limit + kZoe + " export --checkpoint " + d + "/good --out " + d + "/x.st", &out);
  EXPECT_EQ(rc, 0) << out;
}

// A complete checkpoint of a model with one unit of one element, saved by one rank.
void write_minimal_checkpoint(const std::string& dir) {
  fs::create_directories(dir);
  CheckpointManifest m;
  m.config = nlohmann::json::object();
  m.units = {{"u", 1, {{"w", {1}, 0, 1}}}};
  std::string rank(12, '\0');  // master, exp_avg, exp_avg_sq of the one element
  std::ofstream(dir + "/" + manifest_rank_file_name(0), std::ios::binary) << rank;
  m.files = {{manifest_rank_file_name(0), rank.size(), checksum_buffer(rank.data(), rank.size())}};
  std::string text = manifest_to_text(m);
  std::ofstream(dir + "/" + kManifestName) << text;
  std::ofstream(dir + "/" + kManifestSumName) << checksum_buffer(text.data(), text.size()) << "\n";
  ASSERT_TRUE(read_manifest(dir).ok()) << read_manifest(dir).status().message();
}

TEST(Checkpoint, StepDirectoriesOfAnyWidthAreResumedAndPrunedInNumericOrder) {
  std::string root = make_temp_dir("ckpt");
  for (const char* step : {"step_99999998", "step_99999999", "step_100000000", "step_100000001"})
    write_minimal_checkpoint(root + "/" + step);
  fs::create_directories(root + "/step_100000002.tmp.77");  // a killed save of this job
  auto latest = latest_checkpoint(root);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest.value(), root + "/step_100000001");
  ASSERT_TRUE(prune_checkpoints(root, 2).ok());
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(root)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_100000000", "step_100000001"}));
}

// Round 3: on main at 8800094 pruning went by name, and a step_00000000 holding the user's files
// and no manifest was deleted right after zoe warned it was "skipping incomplete checkpoint".
TEST(Checkpoint, PruningRemovesOnlyDirectoriesWithAZoeManifest) {
  std::string root = make_temp_dir("ckpt");
  fs::create_directories(root + "/step_00000000");
  std::ofstream(root + "/step_00000000/thesis.tex") << "years of work";
  fs::create_directories(root + "/step_00000001");
  std::ofstream(root + "/step_00000001/manifest.json") << "{\"not\": \"zoe's\"}";
  fs::create_directories(root + "/elsewhere");
  fs::create_symlink(root + "/elsewhere", root + "/step_00000002");
  for (const char* step : {"step_00000003", "step_00000004", "step_00000005"})
    write_minimal_checkpoint(root + "/" + step);
  ASSERT_TRUE(prune_checkpoints(root, 1).ok());
  EXPECT_EQ(slurp(root + "/step_00000000/thesis.tex"), "years of work");
  EXPECT_TRUE(fs::exists(root + "/step_00000001/manifest.json"));
  EXPECT_TRUE(fs::is_symlink(root + "/step_00000002"));
  EXPECT_TRUE(fs::exists(root + "/elsewhere"));
  EXPECT_FALSE(fs::exists(root + "/step_00000003"));
  EXPECT_FALSE(fs::exists(root + "/step_00000004"));
  EXPECT_TRUE(fs::exists(root + "/step_00000005/manifest.json"));
}

// Starts a long checkpointing run of zoe itself (no shell in between: the pid is zoe's).
pid_t start_zoe(const std::string& root, int n_embd) {
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    std::string dir = "zoe.checkpoint.dir=\"" + root + "\"", embd = "zoe.model.n_embd=" + std::to_string(n_embd);
    execl(kZoe.c_str(), "zoe", "train", "--quiet", "--set", "zoe.model.type=mlp", "--set", "zoe.model.n_layer=4", "--set",
          embd.c_str(), "--set", "zoe.checkpoint.every=1", "--set", "zoe.checkpoint.keep=2", "--set", dir.c_str(),
          "--set", "zoe.steps=100000", nullptr);
    _exit(127);
  }
  return pid;
}

TEST(Checkpoint, ASecondJobOnTheSameCheckpointDirectoryExitsTwoNamingTheFirst) {
  std::string d = make_temp_dir("ckpt");
  pid_t first = start_zoe(d + "/c", 256);
  std::string latest;
  for (int i = 0; i < 600 && latest.empty(); ++i) {  // its first checkpoint
    usleep(100 * 1000);
    auto l = latest_checkpoint(d + "/c");
    if (l.ok()) latest = l.value();
  }
  ASSERT_FALSE(latest.empty()) << "the first job wrote no checkpoint in 60 s";
  std::string out;
  int rc = run_command(kZoe + kBase + " --set zoe.steps=3 --set zoe.checkpoint.keep=1 --set zoe.checkpoint.dir='\"" + d +
                           "/c\"'", &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("in use by another job (pid " + std::to_string(first)), std::string::npos) << out;
  EXPECT_NE(out.find("zoe.checkpoint.dir"), std::string::npos) << out;
  // The first job went on saving, untouched: its newest checkpoint is whole.
  usleep(500 * 1000);
  EXPECT_TRUE(kill_and_reap(first)) << "the first job ended before the kill";
  auto now = latest_checkpoint(d + "/c");
  ASSERT_TRUE(now.ok());
  auto m = read_manifest(now.value());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->world_size, 1);
  EXPECT_EQ(m->config["zoe"]["model"]["n_embd"], 256);  // the first job's, not the second's 48
  // A killed job's lock is free: the next job on the root resumes from its checkpoint.
  out.clear();
  rc = run_command(kZoe + " train --set zoe.model.type=mlp --set zoe.model.n_layer=4 --set zoe.model.n_embd=256"
                   " --set zoe.checkpoint.dir='\"" + d + "/c\"' --set zoe.steps=" +
                   std::to_string(m->train_state.steps_done + 1), &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("resuming from"), std::string::npos) << out;
}

TEST(Checkpoint, AnIncompleteNewestCheckpointIsSkippedWithAWarning) {
  std::string d = make_temp_dir("ckpt");
  std::string cmd = kZoe + kBase + " --set zoe.checkpoint.every=1 --set zoe.checkpoint.keep=3 --set zoe.checkpoint.dir='\"" +
                    d + "/c\"'";
  run_ok(cmd + " --set zoe.steps=2 --report " + d + "/r.jsonl");
  fs::remove(d + "/c/step_00000002/manifest.json");
  std::string out;
  int rc = run_command(cmd.substr(0, cmd.find(" --quiet")) + cmd.substr(cmd.find(" --quiet") + 8) +
                           " --set zoe.steps=4 --report " + d + "/r.jsonl", &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("warning: skipping incomplete checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("step_00000002"), std::string::npos) << out;
  EXPECT_NE(out.find("resuming from " + d + "/c/step_00000001"), std::string::npos) << out;
  // The resumed run appended to the report: steps 1, 2, then 2, 3, 4 again from step 1.
  EXPECT_EQ(losses(d + "/r.jsonl").size(), 5u);
}

TEST(Checkpoint, KillDuringSaveLeavesTheLastCheckpointLoadable) {
  std::string d = make_temp_dir("ckpt");
  // A larger model so a save takes long enough to be hit; a checkpoint every step.
  std::string cmd = kZoe + " train --quiet --set zoe.model.type=mlp --set zoe.model.n_layer=4 --set zoe.model.n_embd=640"
                           " --set zoe.checkpoint.every=1 --set zoe.checkpoint.keep=2 --set zoe.checkpoint.dir='\"" +
                    d + "/c\"'";
  run_ok(cmd + " --set zoe.steps=1");
  for (int delay_ms : {150, 300, 450, 600, 750}) {
    pid_t pid = fork();
    if (pid == 0) {  // zoe itself, no shell in between, so the kill hits the writer
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      std::string dir = "zoe.checkpoint.dir=\"" + d + "/c\"";
      execl(kZoe.c_str(), "zoe", "train", "--quiet", "--set", "zoe.model.type=mlp", "--set", "zoe.model.n_layer=4", "--set", "zoe.model.n_embd=640",
            "--set", "zoe.checkpoint.every=1", "--set", "zoe.checkpoint.keep=2", "--set", dir.c_str(), "--set",
            "zoe.steps=1000", nullptr);
      _exit(127);
    }
    usleep(delay_ms * 1000);
    ASSERT_TRUE(kill_and_reap(pid)) << "zoe ended before the kill";
    auto latest = latest_checkpoint(d + "/c");
    ASSERT_TRUE(latest.ok());
    auto m = read_manifest(latest.value());
    EXPECT_TRUE(m.ok()) << "after kill at " << delay_ms << " ms: " << m.status().message();
    // and it really loads: one more step from it succeeds
    int64_t step = m.ok() ? m.value().train_state.steps_done : 0;
    run_ok(cmd + " --set zoe.steps=" + std::to_string(step + 1));
  }
}

}  // namespace
}  // namespace zoe::test

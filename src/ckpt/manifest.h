// A checkpoint's manifest.json as plain data, and the one validator that resume, `zoe export`
// and the fuzzer share. parse_manifest() touches no file: it checks every field against the
// others (file names are the expected plain names, shapes and offsets fit their unit, a unit's
// tensors do not overlap, file sizes equal what the unit layout implies, counters and the data
// position are in [0, 2^40], the loss scale is finite and positive), whatever the format version,
// so later code can index with manifest values without checking them again.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "zoe/status.h"

namespace zoe {

// Format 2 keeps manifest.json's own xxh3 beside it (manifest.xxh3); format 1 (older zoe) did
// not, and is still read.
inline constexpr int kCheckpointFormat = 2;
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kManifestSumName = "manifest.xxh3";

// Trainer state beyond the engine's tensors.
struct TrainState {
  int64_t steps_done = 0;        // optimizer steps taken (applied or skipped)
  int64_t steps_applied = 0;
  double loss_scale = 1;
  int64_t scaler_good_steps = 0;
  int scaler_hysteresis = 0;
  int64_t data_position = 0;     // BatchSource::position()
  uint64_t data_shard = 0;       // token loaders: shard index
  double last_loss = 0;
};

struct ManifestTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements from the unit's start
  int64_t numel = 0;   // product of shape
};

struct ManifestUnit {
  std::string name;
  int64_t numel = 0;
  std::vector<ManifestTensor> tensors;
};

struct ManifestFile {
  std::string name;  // rank_NNNNN.bin, a plain name inside the checkpoint directory
  uint64_t bytes = 0;
  std::string xxh3;  // 16 hex digits
};

struct CheckpointManifest {
  int format_version = kCheckpointFormat;
  int world_size = 1;
  int stage = 0;
  nlohmann::json config;  // the saving run's effective config (informative)
  std::vector<ManifestUnit> units;
  std::vector<ManifestFile> files;
  TrainState train_state;  // steps_done is the manifest's "step"
};

// Element counts of the saving run's N-way chunking (contracts: rank r owns [r*c, r*c + owned)).
int64_t manifest_chunk(int64_t numel, int world);
int64_t manifest_owned(int64_t numel, int world, int rank);
// The size each rank's file must have: master, exp_avg, exp_avg_sq of its owned elements of
// every unit.
std::vector<uint64_t> manifest_file_bytes(const std::vector<ManifestUnit>& units, int world);
std::string manifest_rank_file_name(int rank);

// Parses and validates manifest.json text; errors are Corrupt and name `dir`, the file and the
// field ("checkpoint 'D': manifest.json field 'files[1].name': ...").
Result<CheckpointManifest> parse_manifest(std::string_view json_text, const std::string& dir);
// The manifest as written to manifest.json.
std::string manifest_to_text(const CheckpointManifest& m);

}  // namespace zoe

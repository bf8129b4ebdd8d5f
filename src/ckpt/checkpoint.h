// Checkpoints (contracts.md): a directory `<dir>/step_<NNNNNNNN>` holding manifest.json and one
// file per rank. File r holds, for every unit u, the elements [r*c_u, r*c_u + owned) of the unit
// (the N-way chunking of the saving run, whatever its stage) as fp32 master, exp_avg, exp_avg_sq,
// back to back. Any rank count and stage can load it: each rank reads the pieces of old chunks
// that overlap its own optimizer range.
//
// Written through AtomicDir (temporary name, fsync, rename): a crash leaves the previous
// checkpoint. The manifest, written last, lists every file's size and xxh3; a checkpoint whose
// files are missing, short or do not match their checksum is refused with an error naming it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/manifest.h"
#include "comm/comm.h"
#include "zoe/engine.h"
#include "zoe/status.h"

namespace zoe {

// Saves on every rank (collective). Returns the checkpoint's path on every rank.
Result<std::string> save_checkpoint(const std::string& root, Engine& e, Comm& comm, const nlohmann::json& config,
                                    int stage, const TrainState& st, int keep);
// The newest complete checkpoint under root ("" when there is none). A newer `step_*` directory
// without a manifest (copied or written by something else half-way) is skipped, and a one-line
// warning for it is appended to `skipped`.
Result<std::string> latest_checkpoint(const std::string& root, std::vector<std::string>* skipped = nullptr);
// Loads into an engine of any rank count and stage (collective); verifies checksums if asked.
Status load_checkpoint(const std::string& path, Engine& e, Comm& comm, bool verify, TrainState* st);
// The manifest, validated: its own checksum (manifest.xxh3), every field (parse_manifest), and
// every listed file present as a regular file of the listed size.
Result<CheckpointManifest> read_manifest(const std::string& path);

// Every unit's full fp32 weights from a checkpoint (for export), in unit and tensor order.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
Result<std::vector<NamedTensor>> read_consolidated_weights(const std::string& path, bool verify);

}  // namespace zoe

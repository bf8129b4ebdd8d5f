// Checkpoints (contracts.md): a directory `<dir>/step_<NNNNNNNN>` (8 digits or more) holding
// manifest.json and one file per rank. File r holds, for every unit u, the elements [r*c_u, r*c_u + owned) of the unit
// (the N-way chunking of the saving run, whatever its stage) as fp32 master, exp_avg, exp_avg_sq,
// back to back. Any rank count and stage can load it: each rank reads the pieces of old chunks
// that overlap its own optimizer range.
//
// Written through AtomicDir (temporary name, fsync, rename): a crash leaves the previous
// checkpoint. The manifest, written last, lists every file's size and xxh3; a checkpoint whose
// files are missing, short or do not match their checksum is refused with an error naming it.
// Export always verifies the checksums; resume does unless zoe.checkpoint.verify is false.
#pragma once
#include <cstdint>
#include <memory>
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
// latest_checkpoint() as rank 0 sees it, on every rank (collective): on a shared file system
// with stale metadata ranks could list different steps and load diverging states.
Result<std::string> agree_latest_checkpoint(const std::string& root, Comm& comm,
                                            std::vector<std::string>* skipped = nullptr);
// Keeps the newest `keep` checkpoints (by step number, of any width) and removes temporary
// directories that killed saves left. Only for the job that holds the root (CheckpointRootLock):
// another job's temporary directory is its save in progress.
Status prune_checkpoints(const std::string& root, int keep);
// Loads into an engine of any rank count and stage (collective); verifies checksums if asked. The
// steps and loss scaler state come back in *st: the caller restores them (ZeroEngine::restore_counters).
Status load_checkpoint(const std::string& path, Engine& e, Comm& comm, bool verify, TrainState* st);
// The manifest, validated: its own checksum (manifest.xxh3), every field (parse_manifest), and
// every listed file present as a regular file of the listed size.
Result<CheckpointManifest> read_manifest(const std::string& path);

// A checkpoint's fp32 weights for export, a tensor at a time: memory is one piece, never a unit
// or the model. Open() validates the manifest and verifies every file's checksum first.
class ChunkReader;
class AtomicFile;
class CheckpointWeights {
 public:
  static Result<std::unique_ptr<CheckpointWeights>> Open(const std::string& path);
  ~CheckpointWeights();

  const CheckpointManifest& manifest() const { return manifest_; }
  // Appends tensor t of unit u (manifest().units[u].tensors) to `out`: t.numel fp32 values.
  Status append_tensor(size_t u, const ManifestTensor& t, AtomicFile& out);

 private:
  CheckpointWeights(std::string path, CheckpointManifest m);
  std::string path_;
  CheckpointManifest manifest_;
  std::unique_ptr<ChunkReader> reader_;
};

}  // namespace zoe

// Deterministic llm.c-style batching over a TokenSource (llm.c's DataLoader without shuffling).
//
// Let G = world * B * T, the tokens of one global batch. The state is (shard, position): the
// token offset in `shard` where the next global batch starts. next_batch():
//   1. if position + G + 1 > shard_tokens(shard): shard = (shard + 1) % num_shards, position = 0
//      (after the last shard this wraps to the first: a new epoch);
//   2. this rank reads the B*T + 1 tokens at position + rank * B * T of that shard:
//      inputs = the first B*T, targets = the last B*T (inputs shifted by one);
//   3. position += G.
// So the ranks read disjoint, adjacent slices of each global batch and change shard together; a
// batch never spans two shards, and the tokens of a shard after the last global batch's final
// target are not used. This is exactly llm.c's rule "advance when
// current_sample_idx >= (ntok - 1) / G", with position = current_sample_idx * G.
// Every shard must hold at least G + 1 tokens.
// The state is the same on every rank and does not depend on rank, so a checkpoint stores it
// once and it restores on any world size or batch shape.
#pragma once
#include <cstdint>

#include "data/token_source.h"
#include "zoe/status.h"

namespace zoe {

struct DataLoaderState {
  uint64_t shard = 0;
  uint64_t position = 0;
  bool operator==(const DataLoaderState&) const = default;
};

class DataLoader {
 public:
  // `source` must outlive the loader. Invalid for B, T < 1, rank outside [0, world), or a shard
  // shorter than world * B * T + 1 tokens (the message says how many are needed).
  static Result<DataLoader> Create(const TokenSource& source, int64_t B, int64_t T, int rank,
                                   int world);

  // Fills inputs[0, B*T) and targets[0, B*T) with this rank's next micro-batch. An error (the
  // file changed since it was checked: TokenSource::copy) leaves the state where it was.
  Status next_batch(int32_t* inputs, int32_t* targets);

  DataLoaderState state() const { return state_; }
  // Invalid when the shard index or the position is outside the source.
  Status restore(const DataLoaderState& s);
  void reset() { state_ = {}; }  // back to shard 0, position 0

  int64_t batch_tokens() const { return B_ * T_; }       // B * T
  uint64_t global_batch_tokens() const { return global_; }  // world * B * T

 private:
  const TokenSource* src_ = nullptr;
  int64_t B_ = 0, T_ = 0;
  int rank_ = 0, world_ = 1;
  uint64_t global_ = 0;
  DataLoaderState state_;
};

}  // namespace zoe

// What a ZeRO stage shards. The engine reads only these flags, never the stage number, so
// stages 0-3 are one pipeline with different things sharded.
#pragma once

namespace zoe {

struct StagePlan {
  bool shard_optimizer = false;  // fp32 master + Adam moments cover this rank's shard
  bool shard_grads = false;      // reduced gradients kept for this rank's shard only
  bool shard_params = false;     // parameters kept for this rank's shard only, gathered on use

  static StagePlan for_stage(int stage) { return {stage >= 1, stage >= 2, stage >= 3}; }
};

}  // namespace zoe

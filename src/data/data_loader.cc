#include "data/data_loader.h"

#include <algorithm>
#include <string>

namespace zoe {

Result<DataLoader> DataLoader::Create(const TokenSource& source, int64_t B, int64_t T, int rank,
                                      int world) {
  if (B < 1 || T < 1)
    return Status::Invalid("batch size B and sequence length T must be >= 1, got B=" +
                           std::to_string(B) + " T=" + std::to_string(T));
  if (world < 1 || rank < 0 || rank >= world)
    return Status::Invalid("rank " + std::to_string(rank) + " is outside world size " +
                           std::to_string(world));
  uint64_t bt, g;
  if (__builtin_mul_overflow(static_cast<uint64_t>(B), static_cast<uint64_t>(T), &bt) ||
      __builtin_mul_overflow(bt, static_cast<uint64_t>(world), &g) || g >= (uint64_t{1} << 62))
    return Status::Invalid("B * T * world overflows");
  if (source.num_shards() == 0) return Status::Invalid("data source has no shards");
  for (size_t i = 0; i < source.num_shards(); ++i) {
    if (source.shard_tokens(i) < g + 1)
      return Status::Invalid(source.shard_path(i) + ": " + std::to_string(source.shard_tokens(i)) +
                             " tokens, too short for one batch: B=" + std::to_string(B) +
                             " x T=" + std::to_string(T) + " on " + std::to_string(world) +
                             " rank(s) needs world*B*T+1 = " + std::to_string(g + 1) +
                             " tokens in every shard");
  }
  DataLoader d;
  d.src_ = &source;
  d.B_ = B;
  d.T_ = T;
  d.rank_ = rank;
  d.world_ = world;
  d.global_ = g;
  return d;
}

Status DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  DataLoaderState at = state_;
  if (at.position + global_ + 1 > src_->shard_tokens(at.shard)) {
    at.shard = (at.shard + 1) % src_->num_shards();
    at.position = 0;
  }
  const uint64_t bt = static_cast<uint64_t>(B_ * T_);
  const uint64_t start = at.position + static_cast<uint64_t>(rank_) * bt;
  // One read of B*T + 1 tokens; the targets are the inputs shifted by one.
  ZOE_RETURN_IF_ERROR(src_->copy(at.shard, start, bt, inputs));
  ZOE_RETURN_IF_ERROR(src_->copy(at.shard, start + bt, 1, targets + bt - 1));
  std::copy(inputs + 1, inputs + bt, targets);
  at.position += global_;
  state_ = at;
  return Status::Ok();
}

Status DataLoader::restore(const DataLoaderState& s) {
  if (s.shard >= src_->num_shards())
    return Status::Invalid("data loader state: shard " + std::to_string(s.shard) +
                           " but the data has " + std::to_string(src_->num_shards()) + " shard(s)");
  if (s.position > src_->shard_tokens(s.shard))
    return Status::Invalid("data loader state: position " + std::to_string(s.position) +
                           " is past the end of " + src_->shard_path(s.shard) + " (" +
                           std::to_string(src_->shard_tokens(s.shard)) + " tokens)");
  state_ = s;
  return Status::Ok();
}

}  // namespace zoe

#include "sched/shard_layout.h"

#include <algorithm>

namespace zoe {

UnitSpec make_unit(std::string name, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  UnitSpec u;
  u.name = std::move(name);
  for (auto& [tn, shape] : tensors) {
    TensorSpec t;
    t.name = tn;
    t.shape = shape;
    t.numel = 1;
    for (int64_t d : shape) t.numel *= d;
    t.offset = u.numel;
    t.decay = shape.size() >= 2;
    u.numel += t.numel;
    u.tensors.push_back(std::move(t));
  }
  return u;
}

ShardLayout::ShardLayout(std::vector<UnitSpec> units, int world) : units_(std::move(units)), world_(world) {
  int64_t full = 0;
  for (auto& u : units_) {
    UnitSlot s;
    s.numel = u.numel;
    s.chunk = (u.numel + world - 1) / world;
    s.full_size = s.chunk * world;
    s.full_offset = full;
    s.shard_offset = shard_;
    full += s.full_size;
    shard_ += s.chunk;
    params_ += u.numel;
    slots_.push_back(s);
  }
}

int64_t ShardLayout::owned_real(int u, int rank) const {
  const UnitSlot& s = slots_[u];
  int64_t lo = rank * s.chunk;
  return std::clamp<int64_t>(s.numel - lo, 0, s.chunk);
}

std::vector<Segment> ShardLayout::segments(int u, int64_t lo, int64_t hi) const {
  std::vector<Segment> out;
  for (const TensorSpec& t : units_[u].tensors) {
    int64_t b = std::max(lo, t.offset), e = std::min(hi, t.offset + t.numel);
    if (b < e) out.push_back({b - lo, e - lo, t.decay});
  }
  return out;
}

}  // namespace zoe

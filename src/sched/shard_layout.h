// ShardLayout: the flat parameter space split into units, and each unit into N equal chunks.
//
// Padding rule: unit u of n_u elements gets chunk c_u = ceil(n_u / N) elements per rank and is
// padded with zeros to N * c_u. Rank r owns elements [r*c_u, (r+1)*c_u) of every unit. A rank's
// shard is its chunks of all units back to back: S = sum_u c_u elements. The full padded space is
// P_pad = N * S >= P, with at most N-1 padding elements per unit. Any N works.
#pragma once
#include <cstdint>
#include <vector>

#include "zoe/unit.h"

namespace zoe {

struct UnitSlot {
  int64_t numel = 0;        // real elements
  int64_t chunk = 0;        // c_u: elements per rank
  int64_t full_offset = 0;  // start of the unit in the full padded space
  int64_t shard_offset = 0; // start of this unit's chunk inside a rank's shard
  int64_t full_size = 0;    // N * c_u
};

// A contiguous run of one tensor's elements within a range of the flat space.
struct Segment {
  int64_t begin = 0, end = 0;  // positions relative to the range start
  bool decay = false;
};

class ShardLayout {
 public:
  ShardLayout(std::vector<UnitSpec> units, int world);

  int world() const { return world_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitSpec& unit(int u) const { return units_[u]; }
  const UnitSlot& slot(int u) const { return slots_[u]; }
  int64_t params() const { return params_; }        // P, unpadded
  int64_t padded_params() const { return world_ * shard_; }  // P_pad
  int64_t shard_size() const { return shard_; }      // S

  // Real (non-padding) elements of unit u owned by `rank`: [begin, end) relative to the chunk.
  int64_t owned_real(int u, int rank) const;
  // Tensor segments covering elements [lo, hi) of unit u (unit-relative), relative to lo.
  std::vector<Segment> segments(int u, int64_t lo, int64_t hi) const;

 private:
  std::vector<UnitSpec> units_;
  std::vector<UnitSlot> slots_;
  int world_;
  int64_t params_ = 0, shard_ = 0;
};

}  // namespace zoe

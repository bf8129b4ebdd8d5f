#include "sched/state_array.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include <fmt/format.h>

#include "common/round_up.h"

namespace zoe {

int64_t offloaded_elems(Tier offload, double ratio, int64_t elems) {
  return offload == Tier::kDevice ? 0 : std::llround(ratio * static_cast<double>(elems));
}

std::vector<int64_t> nvme_segments(std::span<const int64_t> unit_starts, int64_t split, int64_t elems) {
  std::vector<int64_t> seg = {split};
  for (int64_t s : unit_starts)
    if (s > split && s < elems) seg.push_back(s);
  return seg;
}

RegionSpec nvme_region(std::string name, std::span<const int64_t> unit_starts, int64_t split, int64_t elems,
                       size_t esize, uint64_t block) {
  RegionSpec spec{std::move(name), 0, {}};
  if (split >= elems) return spec;
  const std::vector<int64_t> seg = nvme_segments(unit_starts, split, elems);
  for (size_t i = 0; i < seg.size(); ++i) {
    const uint64_t n = static_cast<uint64_t>((i + 1 < seg.size() ? seg[i + 1] : elems) - seg[i]) * esize;
    spec.segment_ends.push_back(spec.bytes + n);
    spec.bytes += round_up<uint64_t>(n, block);
  }
  return spec;
}

Status StateArray::allocate(Device& dev, const StateHome& home, int64_t elems, size_t esize, Kind kind,
                            std::span<const int64_t> unit_starts) {
  home_ = home;
  elems_ = elems;
  esize_ = esize;
  kind_ = kind;
  int64_t offloaded = offloaded_elems(home.offload, home.ratio, elems);
  split_ = elems - offloaded;
  // Memory parts are zeroed now: padding must be zero, and it takes the first-touch cost here.
  auto make = [&](Buffer& b, int64_t n, Tier t) -> Status {
    ZOE_ASSIGN_OR_RETURN(b, dev.alloc(n * esize, t, kind));
    return dev.zero(b.data, b.bytes);
  };
  if (split_ > 0 || offloaded == 0) ZOE_RETURN_IF_ERROR(make(main_, split_, Tier::kDevice));
  if (offloaded == 0) return Status::Ok();
  if (home.offload == Tier::kHost) return make(offload_, offloaded, Tier::kHost);
  if (!home.store) return Status::Runtime("state on the nvme tier without an NVMe store");
  // The engine opens the store with every region it plans, so that one free-space check covers
  // them all; a region not planned is added (and checked) here.
  segments_ = nvme_segments(unit_starts, split_, elems_);
  const RegionSpec spec = nvme_region(home.region, unit_starts, split_, elems_, esize, home.store->block_size());
  // Segment i begins where segment i - 1's blocks end.
  seg_offset_ = {0};
  for (size_t i = 0; i + 1 < segments_.size(); ++i) {
    const uint64_t block = home.store->block_size();
    seg_offset_.push_back(round_up<uint64_t>(spec.segment_ends[i], block));
  }
  if (!home.store->region(home.region).ok()) ZOE_RETURN_IF_ERROR(home.store->add_regions({&spec, 1}));
  ZOE_ASSIGN_OR_RETURN(region_, home.store->region(home.region));
  if (home.store->region_bytes(region_) != spec.bytes)
    return Status::Runtime(fmt::format("NVMe region '{}' has {} bytes, {} planned", home.region,
                                       home.store->region_bytes(region_), spec.bytes));
  dev.ledger().add(Tier::kNvme, kind, static_cast<uint64_t>(offloaded) * esize);
  return Status::Ok();
}

int64_t StateArray::part_end(int64_t e) const {
  if (e < split_) return split_;
  if (segments_.empty()) return elems_;
  size_t i = segment_of(e);
  return i + 1 < segments_.size() ? segments_[i + 1] : elems_;
}

size_t StateArray::segment_of(int64_t e) const {
  return static_cast<size_t>(std::upper_bound(segments_.begin(), segments_.end(), e) - segments_.begin()) - 1;
}

uint64_t StateArray::region_offset(int64_t e) const {
  size_t i = segment_of(e);
  return seg_offset_[i] + static_cast<uint64_t>(e - segments_[i]) * esize_;
}

bool StateArray::same_segments(const StateArray& o) const {
  return split_ == o.split_ && elems_ == o.elems_ && segments_ == o.segments_;
}

void StateArray::release(Device& dev) {
  dev.free(main_);
  dev.free(offload_);
  if (region_ >= 0) dev.ledger().sub(Tier::kNvme, kind_, static_cast<uint64_t>(elems_ - split_) * esize_);
  region_ = -1;
}

char* StateArray::ptr(int64_t e) const {
  const Buffer& b = buffer_of(e);
  return b.as<char>() + buffer_offset(e);
}

Ticket StateArray::read_async(int64_t e, int64_t n, void* dst, bool background, std::shared_ptr<BlockSums> sums,
                              std::function<void()> landed) const {
  assert(n == 0 || e + n <= part_end(e));
  return home_.store->read_async(region_, region_offset(e), dst, n * esize_,
                                 {background, std::move(sums), false, std::move(landed)});
}

// A write that reaches its segment's end leaves padding behind it in that block.
Ticket StateArray::write_async(int64_t e, int64_t n, const void* src, bool background,
                               std::shared_ptr<BlockSums> sums) const {
  assert(n == 0 || e + n <= part_end(e));
  return home_.store->write_async(region_, region_offset(e), src, n * esize_,
                                  {background, std::move(sums), /*pad_last_block=*/e + n == part_end(e), {}});
}

WholeBlocks StateArray::caller_blocks(int64_t e, int64_t n) const {
  if (!home_.store->checksums()) return {};
  return home_.store->caller_blocks(region_, region_offset(e), n * esize_);
}

}  // namespace zoe

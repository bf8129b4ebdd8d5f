#include "sched/state_array.h"

#include <cmath>

#include <fmt/format.h>

namespace zoe {

int64_t offloaded_elems(Tier offload, double ratio, int64_t elems) {
  return offload == Tier::kDevice ? 0 : std::llround(ratio * static_cast<double>(elems));
}

Status StateArray::allocate(Device& dev, const StateHome& home, int64_t elems, size_t esize, Kind kind) {
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
  RegionSpec spec{home.region, static_cast<uint64_t>(offloaded) * esize};
  if (!home.store->region(home.region).ok()) ZOE_RETURN_IF_ERROR(home.store->add_regions({&spec, 1}));
  ZOE_ASSIGN_OR_RETURN(region_, home.store->region(home.region));
  if (home.store->region_bytes(region_) != spec.bytes)
    return Status::Runtime(fmt::format("NVMe region '{}' has {} bytes, {} planned", home.region,
                                       home.store->region_bytes(region_), spec.bytes));
  dev.ledger().add(Tier::kNvme, kind, spec.bytes);
  return Status::Ok();
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

Ticket StateArray::read_async(int64_t e, int64_t n, void* dst, bool background,
                              std::shared_ptr<BlockSums> sums) const {
  return home_.store->read_async(region_, static_cast<uint64_t>(e - split_) * esize_, dst, n * esize_, background,
                                 std::move(sums));
}

Ticket StateArray::write_async(int64_t e, int64_t n, const void* src, bool background,
                               std::shared_ptr<BlockSums> sums) const {
  return home_.store->write_async(region_, static_cast<uint64_t>(e - split_) * esize_, src, n * esize_, background,
                                  std::move(sums));
}

WholeBlocks StateArray::caller_blocks(int64_t e, int64_t n) const {
  if (!home_.store->checksums()) return {};
  return home_.store->caller_blocks(region_, static_cast<uint64_t>(e - split_) * esize_, n * esize_);
}

}  // namespace zoe

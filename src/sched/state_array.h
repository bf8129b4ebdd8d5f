// StateArray: one kind of persistent state (the parameter shard, fp32 master, exp_avg or
// exp_avg_sq) as a flat array of elements with a home on up to two tiers. Elements [0, split)
// live in memory on the primary tier (device); [split, size) live on the offload tier: host
// memory, or a region of an NVMe store. `ratio` is the fraction on the offload tier (DeepSpeed's
// partial offload). The engine computes on memory parts in place (ptr) and reaches NVMe parts
// through windows it reads into, and writes back from, pinned memory (read_async, write_async).
//
// On NVMe the elements are cut into segments, one per unit (the engine's transfers never cross a
// unit), and each segment begins on a block of its region: a unit's reads and write-backs share
// no block with its neighbours', so they are neither read twice nor read-modify-written. A
// segment's last block ends with its data (rounded up to the direct-I/O alignment): the padding up
// to the next block is neither moved nor hashed.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nvme/nvme_store.h"
#include "zoe/device.h"

namespace zoe {

struct StateHome {
  Tier offload = Tier::kDevice;  // kDevice: no offload; kHost; kNvme
  double ratio = 1.0;            // fraction of the elements on `offload`
  NvmeStore* store = nullptr;    // for kNvme
  std::string region;            // the store's region name for kNvme
};

// How many of `elems` elements a home puts on its offload tier.
int64_t offloaded_elems(Tier offload, double ratio, int64_t elems);

// The first element of each NVMe segment of elements [split, elems) cut at `unit_starts`.
std::vector<int64_t> nvme_segments(std::span<const int64_t> unit_starts, int64_t split, int64_t elems);
// The NVMe region that holds them: each segment begins on a block (the region is the segments
// rounded up to whole blocks) and its last block ends with its data (RegionSpec::segment_ends).
RegionSpec nvme_region(std::string name, std::span<const int64_t> unit_starts, int64_t split, int64_t elems,
                       size_t esize, uint64_t block);

class StateArray {
 public:
  StateArray() = default;
  StateArray(StateArray&&) = default;
  StateArray& operator=(StateArray&&) = default;
  // Allocates the memory parts (zeroed) and, for an NVMe home, adds the store region (zero until
  // written, laid out as nvme_region says); every part is booked in the device's ledger under its tier
  // and `kind` (the NVMe part by its elements, not its padding). unit_starts: the first element
  // of each unit, ascending (empty: one unit).
  Status allocate(Device& dev, const StateHome& home, int64_t elems, size_t esize, Kind kind,
                  std::span<const int64_t> unit_starts = {});
  void release(Device& dev);

  int64_t size() const { return elems_; }
  size_t esize() const { return esize_; }
  int64_t split() const { return split_; }
  bool on_nvme(int64_t e) const { return region_ >= 0 && e >= split_; }
  bool has_nvme() const { return region_ >= 0; }
  // The end of the part holding element e, and on NVMe of its segment: ranges the engine walks
  // never cross it.
  int64_t part_end(int64_t e) const;
  // The same split, size and segments (blocks begin at the same elements; their grids nest when
  // element sizes divide each other).
  bool same_segments(const StateArray& o) const;

  // Whether element e is device memory (else host memory or NVMe): where Adam runs on it.
  bool in_device_memory(int64_t e) const { return e < split_; }

  // Memory parts only (!on_nvme(e)).
  char* ptr(int64_t e) const;
  const Buffer& buffer_of(int64_t e) const { return e < split_ ? main_ : offload_; }
  size_t buffer_offset(int64_t e) const { return (e < split_ ? e : e - split_) * esize_; }

  // NVMe parts only: elements [e, e + n), inside one segment, to or from memory that stays valid
  // until waited for; `landed` as in TransferOptions (called on the I/O thread once read).
  Ticket read_async(int64_t e, int64_t n, void* dst, bool background = false,
                    std::shared_ptr<BlockSums> sums = nullptr, std::function<void()> landed = {}) const;
  Ticket write_async(int64_t e, int64_t n, const void* src, bool background = false,
                     std::shared_ptr<BlockSums> sums = nullptr) const;
  // Checksums a caller makes and checks itself (NvmeStore::caller_blocks): the store's blocks that
  // elements [e, e + n) cover whole; empty where the store keeps no checksums.
  WholeBlocks caller_blocks(int64_t e, int64_t n) const;
  int64_t block_elems() const { return home_.store->block_size() / esize_; }
  // The first element of e's segment: its blocks begin there, every block_elems() elements.
  int64_t segment_begin(int64_t e) const { return segments_[segment_of(e)]; }
  // The store's block that holds element e.
  uint64_t block_of(int64_t e) const { return region_offset(e) / home_.store->block_size(); }
  Status check_sum(uint64_t block, uint64_t recorded, uint64_t got) const {
    return home_.store->check_sum(region_, block, recorded, got);
  }
  Status wait(const Ticket& t) const { return home_.store->wait(t); }
  bool ready(const Ticket& t) const { return home_.store->ready(t); }

 private:
  size_t segment_of(int64_t e) const;
  uint64_t region_offset(int64_t e) const;

  StateHome home_;
  std::vector<int64_t> segments_;     // NVMe segments' first elements (the first is split_)
  std::vector<uint64_t> seg_offset_;  // and where each begins in the region (a block boundary)
  int64_t elems_ = 0, split_ = 0;
  size_t esize_ = 0;
  Kind kind_ = Kind::kParam;
  Buffer main_, offload_;  // offload_ only for a host-memory offload part
  int region_ = -1;
};

}  // namespace zoe

// StateArray: one kind of persistent state (the parameter shard, fp32 master, exp_avg or
// exp_avg_sq) as a flat array of elements with a home on up to two tiers. Elements [0, split)
// live in memory on the primary tier (device); [split, size) live on the offload tier: host
// memory, or a region of an NVMe store. `ratio` is the fraction on the offload tier (DeepSpeed's
// partial offload). The engine computes on memory parts in place (ptr) and reaches NVMe parts
// through windows it reads into, and writes back from, pinned memory (read_async, write_async).
#pragma once
#include <cstdint>
#include <string>

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

class StateArray {
 public:
  StateArray() = default;
  StateArray(StateArray&&) = default;
  StateArray& operator=(StateArray&&) = default;
  // Allocates the memory parts (zeroed) and, for an NVMe home, adds the store region (zero until
  // written); every part is booked in the device's ledger under its tier and `kind`.
  Status allocate(Device& dev, const StateHome& home, int64_t elems, size_t esize, Kind kind);
  void release(Device& dev);

  int64_t size() const { return elems_; }
  size_t esize() const { return esize_; }
  int64_t split() const { return split_; }
  bool on_nvme(int64_t e) const { return region_ >= 0 && e >= split_; }
  bool has_nvme() const { return region_ >= 0; }
  // The end of the part holding element e: ranges the engine walks never cross it.
  int64_t part_end(int64_t e) const { return e < split_ ? split_ : elems_; }

  // Whether element e is device memory (else host memory or NVMe): where Adam runs on it.
  bool in_device_memory(int64_t e) const { return e < split_; }

  // Memory parts only (!on_nvme(e)).
  char* ptr(int64_t e) const;
  const Buffer& buffer_of(int64_t e) const { return e < split_ ? main_ : offload_; }
  size_t buffer_offset(int64_t e) const { return (e < split_ ? e : e - split_) * esize_; }

  // NVMe parts only: elements [e, e + n) to or from memory that stays valid until waited for.
  Ticket read_async(int64_t e, int64_t n, void* dst, bool background = false,
                    std::shared_ptr<BlockSums> sums = nullptr) const;
  Ticket write_async(int64_t e, int64_t n, const void* src, bool background = false,
                     std::shared_ptr<BlockSums> sums = nullptr) const;
  // Checksums a caller makes and checks itself (NvmeStore::caller_blocks): the store's blocks that
  // elements [e, e + n) cover whole; empty where the store keeps no checksums. Block k begins at
  // element split() + k * block_elems().
  WholeBlocks caller_blocks(int64_t e, int64_t n) const;
  int64_t block_elems() const { return home_.store->block_size() / esize_; }
  Status check_sum(uint64_t block, uint64_t recorded, uint64_t got) const {
    return home_.store->check_sum(region_, block, recorded, got);
  }
  Status wait(const Ticket& t) const { return home_.store->wait(t); }

 private:
  StateHome home_;
  int64_t elems_ = 0, split_ = 0;
  size_t esize_ = 0;
  Kind kind_ = Kind::kParam;
  Buffer main_, offload_;  // offload_ only for a host-memory offload part
  int region_ = -1;
};

}  // namespace zoe

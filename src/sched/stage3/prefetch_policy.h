// PrefetchPolicy: every decision of stage 3's scheduler (UnitScheduler): which units to start
// loading ahead of compute and where (a device buffer, or staged in pinned memory), which to keep
// gathered after their release, which to evict when the device is full, and which gather may run
// one fetch ahead. A pure function of the plan, the units' sizes, what is resident, the device
// room and the limits, so it is tested with fakes and runs the same on every device.
//
// DeepSpeed's meaning of the limits, in elements:
//   bucket_elems       (stage3_prefetch_bucket_size): a load starts ahead while fewer elements
//                      than this are on their way (DeepSpeed's coordinator checks before it
//                      adds, so the unit that crosses the bucket still goes: a unit larger than
//                      the bucket, as a 2560-wide block against the default 5e7, is loaded one
//                      ahead instead of never); 0 turns prefetching off;
//   max_live_elems     (stage3_max_live_parameters): gathered plus loading elements at once;
//   max_reuse_distance (stage3_max_reuse_distance): a released unit stays gathered when the
//                      plan fetches it again within this many elements; 0 never keeps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace zoe {

struct PrefetchLimits {
  int64_t bucket_elems = 0;
  int64_t max_live_elems = 0;
  int64_t max_reuse_distance = 0;
  bool operator==(const PrefetchLimits&) const = default;
};

// Where a unit's gathered parameters are. kStaged: its chunk is being read from NVMe into pinned
// host memory, with no device buffer yet (the device had no room); kLoading: on its way into a
// device buffer. Both count as on their way (and as live) for the policy.
enum class Residency : uint8_t { kAbsent = 0, kLoading, kGathered, kStaged };

// A load to start ahead: into a device buffer, or staged (NVMe reads into pinned memory only).
struct AheadLoad {
  int u;
  bool staged;
  bool operator==(const AheadLoad&) const = default;
};

class PrefetchPolicy {
 public:
  PrefetchPolicy(std::vector<int64_t> unit_elems, PrefetchLimits limits)
        : elems_(std::move(unit_elems)), limits_(limits) {}

  // room: gathered elements the device can take beside what it must leave free (negative when
  // it has less than that).
  //
  // Units to start loading now, in plan order: the distinct units from plan[next] on that are
  // absent, as long as fewer elements than the bucket are on their way before each and
  // everything live stays within max_live_elems. Stops at the first unit that does not fit (the
  // order is the point). A unit the room left cannot take is staged.
  std::vector<AheadLoad> ahead(const std::vector<int>& plan, size_t next, const std::vector<Residency>& state,
                               int64_t room) const;

  // Whether unit u, just released with the plan at `next`, is fetched again soon enough to keep
  // (never when the room is negative).
  bool keep(const std::vector<int>& plan, size_t next, int u, const std::vector<Residency>& state,
            int64_t room) const;

  // The order in which to drop `idle` units (kept or loading, not fetched) for a full device:
  // the one the plan fetches furthest from `next` first, those it does not fetch again before all
  // (Belady's choice); ties by unit index.
  std::vector<int> evict_order(const std::vector<int>& plan, size_t next, std::vector<int> idle) const;

  // The unit whose gather may start one fetch ahead, on u's fetch: the plan's next, unless it is
  // u itself; -1 for none.
  int gather_ahead(const std::vector<int>& plan, size_t next, int u) const;

  int64_t live_elems(const std::vector<Residency>& state) const;

 private:
  std::vector<int64_t> elems_;
  PrefetchLimits limits_;
};

}  // namespace zoe

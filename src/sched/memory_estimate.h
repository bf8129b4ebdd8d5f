// The seed's per-rank model-state table: bytes of param, grad, master, exp_avg, exp_avg_sq per
// rank for stages 0-3 (16P, 4P+12P/N, 2P+14P/N, 16P/N in mixed precision), idealised (no
// padding), and the exact figure the engine's ledger shows once the padding rule is applied.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "common/offload_config.h"
#include "zoe/dtype.h"
#include "zoe/ledger.h"

namespace zoe {

struct StageMemory {
  int stage = 0;
  std::array<double, kNumPersistentKinds> by_kind{};  // bytes per rank
  std::array<double, kNumTiers> by_tier{};            // where they live with the config's offload
  double total() const;
};

// Idealised: P elements split exactly N ways. dtype = weight/grad type (fp32: no separate master).
StageMemory estimate_stage(double params, int ranks, int stage, DType dtype, OffloadDevice optimizer_tier,
                           OffloadDevice param_tier);

// Exact, for a layout with P_pad = N*S padded elements: the same formula with P -> P_pad and
// P/N -> S. This is what ZeroEngine allocates, to the byte. An offload home with a ratio below 1
// holds llround(ratio x the elements) of its arrays, the rest stays on the device (StateArray's split).
StageMemory exact_stage(int64_t padded_params, int64_t shard, int stage, DType dtype,
                        OffloadDevice optimizer_tier, OffloadDevice param_tier, double optimizer_ratio = 1,
                        double param_ratio = 1);

// What one unit of `full` padded elements needs on the device while in flight at `stage`: its
// gathered weights (stage 3), the fp32 gradient the model hands over, its reduction buffer
// (stages 2-3). The engine reserves the largest; a plan counts it the same way.
uint64_t unit_in_flight_bytes(int64_t full, int stage, size_t wsize, size_t gsize);
// What the communication thread (overlap_comm, stages 2-3) adds to that reserve: one more reduction
// buffer of the largest unit, for the hand-over that comes while the last one still reduces. It
// starts only where the device holds it beside the state and the reserve (a plan counts it so).
uint64_t comm_thread_bytes(int64_t largest_full, size_t gsize);

// The NVMe tier's pinned pool, as RankState opens it (a plan counts it the same way).
struct PinnedPoolSize {
  uint64_t bytes = 0;      // the pool: at most 2 GiB, a quarter of the host budget, what it must hold
  uint64_t io = 0;         // the stores' I/O buffers (queue depth x block size each) and 1 MiB slack
  uint64_t per_group = 0;  // bytes a sub-group element takes in its windows
};
struct PinnedPoolInputs {
  int stores = 1;                    // NVMe paths, a store each
  uint64_t bounce = 0;               // aio queue depth x block size
  uint64_t window_per_elem = 0;      // bytes per element each of the three windows streams: the
                                     // optimizer's state on NVMe, and the parameter where it is there
  uint64_t param_per_elem = 0;       // the parameters' width where they are on NVMe (stage 3), else 0
  int64_t most_elems = 0;            // the most elements of one kind on NVMe
  int64_t sub_group_size = 0;
  uint64_t host_budget = 0;
};
// Three optimizer windows of a sub-group rotate, and beside them two windows of parameter chunks
// on their way to a gather; the sub-group is sub_group_size elements, or fewer when the state on
// NVMe is smaller, at least 1024.
PinnedPoolSize pinned_pool_size(const PinnedPoolInputs& in);
// Its per-element part alone: 3 x window_per_elem + 2 x param_per_elem.
uint64_t pinned_pool_per_group(uint64_t window_per_elem, uint64_t param_per_elem);

}  // namespace zoe

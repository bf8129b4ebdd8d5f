#include "sched/memory_estimate.h"

#include <algorithm>

#include <cmath>

namespace zoe {

double StageMemory::total() const {
  double s = 0;
  for (double b : by_kind) s += b;
  return s;
}

namespace {

// full = elements of a replicated copy, part = elements of one rank's shard. An offloaded home
// holds llround(ratio x its elements) of each array (StateArray's split), the rest is on the device.
StageMemory table(double full, double part, int stage, DType dtype, OffloadDevice opt, OffloadDevice par,
                  double opt_ratio = 1, double par_ratio = 1) {
  StageMemory m;
  m.stage = stage;
  double w = static_cast<double>(dtype_size(dtype));
  bool mixed = dtype != DType::kF32;
  const double params = stage >= 3 ? part : full, opt_elems = stage >= 1 ? part : full;
  m.by_kind[static_cast<int>(Kind::kParam)] = w * params;
  m.by_kind[static_cast<int>(Kind::kGrad)] = w * (stage >= 2 ? part : full);
  m.by_kind[static_cast<int>(Kind::kMaster)] = mixed ? 4 * opt_elems : 0;
  m.by_kind[static_cast<int>(Kind::kExpAvg)] = 4 * opt_elems;
  m.by_kind[static_cast<int>(Kind::kExpAvgSq)] = 4 * opt_elems;
  auto tier = [](OffloadDevice d) { return d == OffloadDevice::kNone ? 0 : d == OffloadDevice::kCpu ? 1 : 2; };
  // The share of `elems` an offload home at tier t holds.
  auto offloaded = [](int t, double ratio, double elems) { return t == 0 ? 0.0 : double(std::llround(ratio * elems)); };
  int opt_t = tier(opt), par_t = (stage >= 3) ? tier(par) : 0;
  const double par_off = offloaded(par_t, par_ratio, params), opt_off = offloaded(opt_t, opt_ratio, opt_elems);
  m.by_tier[par_t] += w * par_off;
  m.by_tier[0] += w * (params - par_off);
  // Sharded gradients follow an offloaded optimizer to host memory (the host Adam reads them).
  m.by_tier[stage >= 2 && opt_t > 0 ? 1 : 0] += m.by_kind[static_cast<int>(Kind::kGrad)];
  const double per = mixed ? 12 : 8;  // fp32 master (mixed precision), exp_avg, exp_avg_sq
  m.by_tier[opt_t] += per * opt_off;
  m.by_tier[0] += per * (opt_elems - opt_off);
  return m;
}

}  // namespace

StageMemory estimate_stage(double p, int n, int stage, DType dtype, OffloadDevice opt, OffloadDevice par) {
  return table(p, p / n, stage, dtype, opt, par);
}

StageMemory exact_stage(int64_t padded, int64_t shard, int stage, DType dtype, OffloadDevice opt, OffloadDevice par,
                        double opt_ratio, double par_ratio) {
  return table(static_cast<double>(padded), static_cast<double>(shard), stage, dtype, opt, par, opt_ratio, par_ratio);
}

uint64_t unit_in_flight_bytes(int64_t full, int stage, size_t wsize, size_t gsize) {
  return static_cast<uint64_t>(full) * ((stage >= 3 ? wsize : 0) + 4 + (stage >= 2 ? gsize : 0));
}

uint64_t comm_thread_bytes(int64_t largest_full, size_t gsize) { return static_cast<uint64_t>(largest_full) * gsize; }

uint64_t pinned_pool_per_group(uint64_t window_per_elem, uint64_t param_per_elem) {
  return 3 * window_per_elem + 2 * param_per_elem;
}

PinnedPoolSize pinned_pool_size(const PinnedPoolInputs& in) {
  constexpr uint64_t kMaxPoolBytes = uint64_t{2} << 30;
  PinnedPoolSize p;
  p.io = uint64_t(in.stores) * in.bounce + (uint64_t{1} << 20);
  p.per_group = pinned_pool_per_group(in.window_per_elem, in.param_per_elem);
  const uint64_t windows =
      p.per_group * static_cast<uint64_t>(std::max<int64_t>(1024, std::min(in.sub_group_size, in.most_elems)));
  p.bytes = std::min({kMaxPoolBytes, in.host_budget / 4, p.io + std::max(windows, uint64_t{3} << 20)});
  return p;
}

}  // namespace zoe

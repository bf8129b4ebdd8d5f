// UnitMover: the mechanism under UnitScheduler's decisions. The scheduler says what moves when;
// a mover only executes: the ranks' agreement before a fetch, a chunk's load from its home tier,
// a unit's all-gather (now, or on the communication thread), and what the optimizer's pass has
// written. RankUnitMover is the engine's; plan/virtual_mover.h runs on a virtual clock (`zoe plan`,
// prefetch_policy_test.cc).
#pragma once
#include <cstdint>
#include <memory>

#include "sched/agreement.h"
#include "sched/stage3/unit_load.h"
#include "zoe/device.h"

namespace zoe {

class UnitMover {
 public:
  virtual ~UnitMover() = default;
  // Every rank says it fetches u. *need in: this rank has to gather u; out: some rank has to
  // (then all do). *ahead in: this rank's view of the next unit; ahead->go out: all gather it now.
  virtual Status agree_fetch(int u, bool* need, AheadGather* ahead) = 0;
  // Whether the optimizer's pass has written u's chunk this step; or wait until it has.
  virtual bool updated(int u) const = 0;
  virtual Status wait_updated(int u) = 0;
  // This rank's chunk of u on its way into dst (an empty dst: NVMe reads into pinned memory only).
  virtual std::unique_ptr<UnitLoad> load(int u, const Buffer& dst) = 0;
  // u's all-gather in buf from this rank's chunk, on the caller's thread.
  virtual Status gather(int u, const Buffer& buf) = 0;
  // Or on the communication thread, after `load` (null: none) finishes: a ticket for wait_gather.
  virtual bool gathers_ahead() const = 0;
  virtual uint64_t gather_ahead(int u, UnitLoad* load, const Buffer& buf) = 0;
  virtual Status wait_gather(int u, uint64_t ticket) = 0;
  // A full device: the gradient reductions in flight give their buffers back.
  virtual Status finish_reductions() = 0;
};

}  // namespace zoe

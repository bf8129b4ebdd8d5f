// Agreement: before each fetch, gradient hand-over and step, every rank says what it calls (one
// all-gather of five words of control traffic) and goes on only once all call the same. Gradients
// one rank hands over are reduced with zeros from the ranks that have none for that unit (through
// the gradient reducer's `reduce`), which lets those ranks' calls meet again; any other
// disagreement is an error on every rank, never a hang. A fetch's agreement also settles whether
// some rank must gather the unit (then all do) and whether the unit the plan fetches next is
// gathered now (AheadGather). Used by GradReducer (hand-overs), RankUnitMover (fetches) and the
// engine (steps).
//
// Threads: the caller's only (the engine's).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "comm/comm.h"
#include "sched/shard_layout.h"
#include "zoe/status.h"

namespace zoe {

// What a fetch's agreement settles about the unit the plan fetches next.
struct AheadGather {
  int v = -1;          // the plan's next unit, or -1
  bool ready = false;  // this rank's chunk of v is loaded or loading with every read issued
  bool needs = false;  // v is not gathered here
  bool go = false;     // out: every rank starts v's gather now
};

class Agreement {
 public:
  enum class Call : int32_t { kFetch = 1, kGrads = 2, kStep = 3 };
  // reduce(v, grad): unit v's gradients reduced over the ranks, this rank's `grad` or zeros (null).
  using Reduce = std::function<Status(int v, const float* grad)>;

  Agreement(Comm& comm, const ShardLayout& layout) : comm_(comm), layout_(layout) {}
  void set_reduce(Reduce reduce) { reduce_ = std::move(reduce); }

  // call kGrads: this rank's gradient of u, reduced once the ranks agree. need (kFetch): in, this
  // rank has to gather u; out, some rank has to. ahead (kFetch): in, this rank's view of the next
  // unit; ahead->go out, every rank gathers it now.
  Status agree(Call call, int u, const float* grad = nullptr, bool* need = nullptr, AheadGather* ahead = nullptr);

 private:
  std::string what(Call call, int u) const;  // "fetch('h.3')", for the out-of-step error

  Comm& comm_;
  const ShardLayout& layout_;
  Reduce reduce_;
};

}  // namespace zoe

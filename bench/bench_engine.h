// A job's device and its engine over a model's units, allocated, the parameters initialised as
// `zoe train` does (c.seed): the setup the training benches and zoe plan's calibration share.
#pragma once
#include <memory>

#include "comm/comm.h"
#include "common/config.h"
#include "model/model.h"
#include "sched/zero_engine.h"
#include "train/backend.h"
#include "zoe/status.h"

namespace zoe {

struct BenchEngine {
  Backend backend;  // owns the device the engine runs on: declared first, destroyed last
  std::unique_ptr<ZeroEngine> engine;
};

Result<BenchEngine> make_bench_engine(const Config& c, Comm& comm, const Model& model);

}  // namespace zoe

#include "bench_engine.h"

#include "ops/model_ops.h"
#include "train/engine_options.h"

namespace zoe {

Result<BenchEngine> make_bench_engine(const Config& c, Comm& comm, const Model& model) {
  BenchEngine b;
  ZOE_ASSIGN_OR_RETURN(b.backend, make_backend(c, comm));
  if (model.uses_device_ops()) ZOE_RETURN_IF_ERROR(b.backend.device->ops().status().prefixed("the device's compute ops: "));
  ZOE_ASSIGN_OR_RETURN(b.engine, ZeroEngine::create(engine_options(c), *b.backend.device, comm, model.units()));
  ZOE_RETURN_IF_ERROR(init_params(*b.engine, model, c.seed));
  return b;
}

}  // namespace zoe

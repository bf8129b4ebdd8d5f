// ModelOps: the compute kernels models are written in, one implementation per device (the
// device's ops()). Every pointer is memory of that device (or host memory it can reach, see
// zoe/device.h); every call is enqueued on the device's compute stream and returns at once, so a
// model reads a result on the host only through Device::download.
//
// The ops, their semantics, sizes and output rules are written once, in model_ops.def (forward
// outputs overwritten, backward outputs ACCUMULATED, a null d* skipped; where a backward takes
// `overwrite`, its outputs are overwritten instead: no zeroing pass first), and the CPU reference
// in gpt2_ops.h implements them; host_model_ops() runs exactly those functions on host memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "zoe/status.h"

namespace zoe {

class ModelOps {
 public:
  virtual ~ModelOps() = default;

  // Seconds each op kind took since the last call (then reset), for benchmarks' breakdowns; ops
  // that do not time themselves (a GPU's, whose calls only enqueue) give an empty map.
  virtual std::map<std::string, double> take_op_seconds() { return {}; }

  // The first failure of an op since construction (a launch, a library call, an allocation, a
  // shape this device cannot run), naming the op and its sizes; later calls still run. Ops return
  // nothing and only enqueue, so a model reads this before it hands an op's result on (a gradient
  // to the engine, the loss to the host): a failed op never becomes a finished step.
  virtual Status status() const { return Status::Ok(); }
  // Device memory the ops hold besides their callers' buffers (a GPU's library workspaces and
  // reduction scratch), taken from the device's budget; it grows to the largest need met so far.
  virtual size_t workspace_bytes() const { return 0; }
  // Whether this device's kernels run the GPT-2 attention at these sizes (B sequences of T
  // positions, C channels in NH heads); asked before any step, so that a shape they cannot run is
  // a configuration error, not a failure in the middle of training.
  virtual Status supports_attention(int B, int T, int C, int NH) const {
    (void)B, (void)T, (void)C, (void)NH;
    return Status::Ok();
  }

  // The op set (model_ops.def: each op's shapes and rules), one pure virtual per op.
#define ZOE_OP(name, params, args, ptrs) virtual void name params = 0;
#include "ops/model_ops.def"
#undef ZOE_OP
};

// The CPU reference functions of gpt2_ops.h on host memory, run on the calling thread.
ModelOps& host_model_ops();

}  // namespace zoe

// host_model_ops(): ModelOps straight onto the fp32 CPU reference (gpt2_ops.h).
#include "ops/gpt2_ops.h"
#include "ops/model_ops.h"

namespace zoe {
namespace {

class HostModelOps final : public ModelOps {
 public:
#define ZOE_OP(name, params, args, ptrs) \
  void name params override { gpt2::name args; }
#include "ops/model_ops.def"
#undef ZOE_OP
};

}  // namespace

ModelOps& host_model_ops() {
  static HostModelOps ops;
  return ops;
}

}  // namespace zoe

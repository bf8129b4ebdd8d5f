// The CPU device's ModelOps: the CPU reference ops (ops/gpt2_ops.h) run inside the device, so
// under cpu-strict each op opens the memory fence for its duration and first checks that every
// pointer it gets is memory the device can reach (a model computing on plain host memory, which a
// GPU could not read, stops there with a message naming the op).
#pragma once
#include <memory>

#include "ops/model_ops.h"

namespace zoe {

class CpuDevice;
std::unique_ptr<ModelOps> make_cpu_model_ops(CpuDevice& dev);

}  // namespace zoe

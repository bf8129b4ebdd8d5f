// Where a part of the engine's state lives besides device memory: the config's
// zero_optimization.offload_optimizer and offload_param sections, which the engine reads as they
// are (plain data shared by common/config.h and sched/engine_options.h).
#pragma once
#include <cstdint>
#include <string>

namespace zoe {

enum class OffloadDevice : uint8_t { kNone, kCpu, kNvme };

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;
  double ratio = 1.0;  // the share of the state offloaded; the rest stays in device memory
};

}  // namespace zoe

// Learning rate at an optimizer step (0-based), DeepSpeed's WarmupLR / WarmupCosineLR rules.
#pragma once
#include <cstdint>

#include "common/config.h"

namespace zoe {
double lr_at(const Config& c, int64_t step);
}

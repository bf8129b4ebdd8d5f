// The engine's options from a job's Config: the one place a config key reaches the engine.
#pragma once
#include "common/config.h"
#include "sched/engine_options.h"

namespace zoe {

EngineOptions engine_options(const Config& c);

}  // namespace zoe

// A model written against zoe's public headers alone (include/zoe): public_api_model.cc is
// compiled with include/ as its only include path (tests/CMakeLists.txt), so a private type
// reaching a public header breaks the build, and linking it with the engine shows the public API
// is all a model needs.
#pragma once
#include <cstdint>
#include <vector>

#include "zoe/engine.h"

namespace public_api {

// One unit "w" of n weights.
std::vector<zoe::UnitSpec> quadratic_units(int64_t n);
// One optimizer step on loss 0.5 * sum(w^2) (gradient w) through the unit API: fetch, compute on
// the host, hand the gradient over from device memory, release, step. Returns the loss before it.
zoe::Result<double> quadratic_step(zoe::Engine& e, double lr);

}  // namespace public_api

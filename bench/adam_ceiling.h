// The bandwidth ceiling of the fused Adam step: a kernel with Adam's memory traffic and no
// arithmetic, to measure in the same run as adam_step.
#pragma once
#include "kernels/adam.h"

namespace zoe {

// Reads every array of `r` (grad, master, m, v) and writes master, m, v and the weight copy,
// with the vector width of `isa`, the same chunks and the same threads as adam_step; the values
// written are those read (the weight copy gets the low bytes of master). Same bytes, no math.
void adam_traffic(const AdamRange& r, Isa isa, int threads);

}  // namespace zoe

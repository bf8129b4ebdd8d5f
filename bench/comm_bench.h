// `zoe bench comm`: zoe's collectives against OpenMPI's own on the same buffers, nccl-tests style
// (size, time, algbw, busbw). Run under mpirun; one rank measures nothing useful.
#pragma once
#include <cstdio>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "zoe/status.h"

namespace zoe {

struct CommBenchOptions {
  std::vector<size_t> sizes;  // total bytes of the full (gathered / unreduced) buffer; default 1 MB..256 MB
  int iters = 10;
};

Status bench_comm(const CommBenchOptions& o, nlohmann::json* out, std::FILE* human);

}  // namespace zoe

// `zoe bench nvme`: the NVMe store's sequential read and write GB/s against fio on the same file
// (DeepSpeed's ds_nvme_tune, with a referee). For each aio.block_size and aio.queue_depth, zoe
// and fio (--ioengine=io_uring --direct=1, the same file, size, block size and depth, registered
// buffers and files, buffers on 2 MiB pages as zoe's pool has them) run back to back in every
// repetition, alternating who goes first; the medians and the median of the repetitions' ratios
// (zoe / fio) are reported, beside fio with its default 4 KiB-page buffers, then the best aio
// settings as a config snippet, then what checksums (zoe.checksums) cost at those settings.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "zoe/status.h"

namespace zoe {

struct NvmeBenchOptions {
  std::string dir = "out/bench-nvme";  // the store's nvme_path; made if missing
  uint64_t file_bytes = uint64_t{1} << 30;
  std::vector<uint32_t> block_sizes = {256u << 10, 1u << 20, 4u << 20, 16u << 20};
  std::vector<unsigned> queue_depths = {8, 32};
  int reps = 3;                        // repetitions per case, each one zoe and fio back to back
  bool checksum_rows = true;
  std::string fio = "fio";
};

// Fills *out with {"bench":"nvme", "results":[{case, op, block_bytes, queue_depth, zoe_GBps,
// fio_GBps, ratio}...], "checksum_cost":[...], "best_aio":{...}}; prints a table to `human` when
// not null. A missing fio leaves fio_GBps and ratio null, with the reason.
Status bench_nvme(const NvmeBenchOptions& o, nlohmann::json* out, std::FILE* human);

}  // namespace zoe

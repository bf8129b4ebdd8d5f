// RegionFile: one named region of a store and the file that holds it.
#pragma once
#include <cstdint>
#include <string>

#include "nvme/block_table.h"
#include "nvme/nvme_env.h"

namespace zoe {

struct RegionFile {
  std::string name;
  std::string path;
  DirectFile file;
  int queue_file = -1;      // index among the queue's registered files
  uint64_t bytes = 0;       // logical size: what callers may read and write
  uint64_t file_bytes = 0;  // bytes rounded up to the direct-I/O alignment: what is allocated
  BlockTable blocks;
};

}  // namespace zoe

#include "nvme/block_sums.h"

#include <algorithm>

namespace zoe {

WholeBlocks whole_blocks(uint64_t offset, uint64_t bytes, uint64_t block_bytes, uint64_t file_bytes) {
  const uint64_t end = offset + bytes;
  const uint64_t first = (offset + block_bytes - 1) / block_bytes;
  uint64_t last = end / block_bytes;  // blocks [first, last) end by the next multiple
  // The file's last block is whole when the range reaches the end of the file.
  if (end == file_bytes && end % block_bytes != 0) ++last;
  return {first, last > first ? last - first : 0};
}

}  // namespace zoe

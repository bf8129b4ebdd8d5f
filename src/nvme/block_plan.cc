#include "nvme/block_plan.h"

#include <algorithm>
#include <cstring>

#include "common/round_up.h"

namespace zoe {

bool pads_rest(const Transfer& t, uint64_t io_begin, uint64_t user_begin, uint64_t user_end) {
  return t.pad_last_block && io_begin == user_begin && user_end == t.offset + t.bytes;
}

BlockPlan plan_block(const Transfer& t, const RegionFile& r, uint64_t block_bytes) {
  BlockPlan p;
  const uint64_t s = t.offset + t.scheduled;
  p.block = s / block_bytes;
  const uint64_t block_begin = r.blocks.begin(p.block);
  const uint64_t block_end = r.blocks.end(p.block), block_io_end = r.blocks.io_end(p.block);
  const uint64_t e = std::min<uint64_t>(t.offset + t.bytes, block_end);
  const uint64_t align = r.file.offset_align;
  const bool sums = r.blocks.checksums();
  p.user_begin = s;
  p.user_end = e;
  p.io_begin = sums ? block_begin : s / align * align;
  p.io_end = sums ? block_io_end : std::min<uint64_t>(round_up<uint64_t>(e, align), block_io_end);
  const bool whole = p.io_begin == s && p.io_end == e;
  const uint8_t* user = t.user + (s - t.offset);
  p.direct = whole && reinterpret_cast<uintptr_t>(user) % r.file.mem_align == 0;
  // A short block's bytes after its data are padding: a write of all its data reads nothing back.
  const bool all_data = s == block_begin && e == block_end;
  p.read_first = t.op == IoOp::kWrite && !whole && !all_data &&
                 r.blocks.state(p.block) != BlockTable::State::kUnwritten && !pads_rest(t, p.io_begin, s, e);
  return p;
}

void stage_write(const BlockPlan& p, uint8_t* bounce, const uint8_t* user) {
  std::memset(bounce, 0, p.user_begin - p.io_begin);
  std::memcpy(bounce + (p.user_begin - p.io_begin), user, p.user_bytes());
  std::memset(bounce + (p.user_end - p.io_begin), 0, p.io_end - p.user_end);
}

void patch_write(const BlockPlan& p, uint8_t* bounce, const uint8_t* user) {
  std::memcpy(bounce + (p.user_begin - p.io_begin), user, p.user_bytes());
}

void unstage_read(const BlockPlan& p, const uint8_t* bounce, uint8_t* user) {
  std::memcpy(user, bounce + (p.user_begin - p.io_begin), p.user_bytes());
}

}  // namespace zoe

#include "nvme/transfer_order.h"

namespace zoe {

bool may_start(const TransferList& queued, size_t i) {
  const Transfer& t = *queued[i];
  const uint64_t lo = t.offset + t.scheduled, hi = t.offset + t.bytes;
  for (size_t j = 0; j < i; ++j) {
    const Transfer& e = *queued[j];
    if (e.region != t.region || (e.op == IoOp::kRead && t.op == IoOp::kRead)) continue;
    const uint64_t elo = e.offset + e.scheduled, ehi = e.offset + e.bytes;  // its bytes not started yet
    if (elo < ehi && elo < hi && lo < ehi) return false;
  }
  return true;
}

std::array<int, 2> next_transfers(const TransferList& queued) {
  int first[2] = {-1, -1};  // the earliest read and write that may start
  for (size_t i = 0; i < queued.size() && (first[0] < 0 || first[1] < 0); ++i) {
    const int op = queued[i]->op == IoOp::kRead ? 0 : 1;
    if (first[op] < 0 && may_start(queued, i)) first[op] = static_cast<int>(i);
  }
  if (first[0] < 0) return {first[1], -1};
  return {first[0], first[1]};
}

}  // namespace zoe

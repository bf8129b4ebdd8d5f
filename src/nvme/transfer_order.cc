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

int earliest_startable(const TransferList& queued, IoOp op) {
  for (size_t i = 0; i < queued.size(); ++i)
    if (queued[i]->op == op && may_start(queued, i)) return static_cast<int>(i);
  return -1;
}

}  // namespace zoe

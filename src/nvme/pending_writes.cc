#include "nvme/pending_writes.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace zoe {

void PendingWrites::remove(const Transfer& w) {
  auto it = std::find_if(writes_.begin(), writes_.end(), [&](const std::shared_ptr<Transfer>& p) { return p.get() == &w; });
  if (it != writes_.end()) writes_.erase(it);
}

bool PendingWrites::serve(Transfer& r) const {
  if (writes_.empty()) return false;  // the usual case: nothing to scan or allocate for
  // Newest first, each byte of the read from the first write that holds it (the newest), until
  // none is left open.
  struct Piece {
    uint64_t lo, hi;
    const Transfer* from;
  };
  std::vector<std::pair<uint64_t, uint64_t>> open = {{r.offset, r.offset + r.bytes}}, rest;
  std::vector<Piece> pieces;
  for (auto it = writes_.rbegin(); it != writes_.rend() && !open.empty(); ++it) {
    const Transfer& w = **it;
    if (w.region != r.region) continue;
    const uint64_t wl = w.offset, wh = w.offset + w.bytes;
    rest.clear();
    for (auto [lo, hi] : open) {
      const uint64_t a = std::max(lo, wl), b = std::min(hi, wh);
      if (a >= b) {
        rest.push_back({lo, hi});
        continue;
      }
      if (w.failed) return false;  // its bytes will not be the device's
      pieces.push_back({a, b, &w});
      if (lo < a) rest.push_back({lo, a});
      if (b < hi) rest.push_back({b, hi});
    }
    open.swap(rest);
  }
  if (!open.empty()) return false;
  for (const Piece& p : pieces) std::memcpy(r.user + (p.lo - r.offset), p.from->user + (p.lo - p.from->offset), p.hi - p.lo);
  if (BlockSums* c = r.caller_sums.get()) std::fill(c->check.begin(), c->check.end(), uint8_t{0});
  return true;
}

}  // namespace zoe

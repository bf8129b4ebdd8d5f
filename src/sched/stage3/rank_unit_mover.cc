#include "sched/stage3/rank_unit_mover.h"

#include "common/profiler.h"

namespace zoe {

// On the communication thread where it issues every tensor collective (NCCL's duplicate), after
// the reductions queued before it: waited for at once.
Status RankUnitMover::gather(int u, const Buffer& buf) {
  if (worker_ && worker_->issues_all()) return worker_->wait(gather_ahead(u, nullptr, buf));
  ZOE_SPAN("all_gather " + name(u), "all_gather", Bucket::kWaitComm);
  size_t n = chunk_bytes(u);
  return comm_.all_gather(buf.as<char>() + comm_.rank() * n, buf.data, n);
}

// The load of our chunk finishes on the communication thread too, then the all-gather runs
// there (a unit gathered already is gathered again in place).
uint64_t RankUnitMover::gather_ahead(int u, UnitLoad* load, const Buffer& buf) {
  return worker_->submit([load, buf = buf.as<char>(), n = chunk_bytes(u), r = comm_.rank(), name = name(u)](Comm& c) {
    Status st = load ? load->finish() : Status::Ok();
    // The other ranks are in this collective: enter it even after a failed load.
    ZOE_SPAN("all_gather " + name, "all_gather", Bucket::kWaitComm);
    Status gathered = c.all_gather(buf + r * n, buf, n);
    return st.ok() ? gathered : st;
  });
}

Status RankUnitMover::wait_gather(int u, uint64_t ticket) {
  ZOE_SPAN("wait all_gather " + name(u), "all_gather", Bucket::kWaitComm);
  return worker_->wait(ticket);
}

}  // namespace zoe

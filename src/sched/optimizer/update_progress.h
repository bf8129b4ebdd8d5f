// UpdateProgress: how far the optimizer's pass over this rank's range has come. Stage 3 runs the
// pass on its own thread, overlapped with the next step's forward; a fetch waits only until its
// own unit is updated. The pass says after each sub-group how many it has done (their NVMe
// write-backs are submitted by then: the store runs requests on a block in submission order, so
// a read issued afterwards sees the update); OptimizerPass knows which count covers which unit.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>

#include "zoe/status.h"

namespace zoe {

class UpdateProgress {
 public:
  void start();                     // a pass begins: nothing is updated yet
  void advance(int64_t upto);       // the pass's first upto sub-groups are updated
  void finish(const Status& st);    // the pass ended; a failure stays until the next start
  // Blocks until upto sub-groups are updated or the pass ended; the pass's error if it failed.
  Status wait_until(int64_t upto);
  bool updated(int64_t upto) const;  // without waiting
  bool running() const;
  // The ended pass's error if no wait_until has returned it yet (then it counts as returned): what
  // an owner going away would otherwise drop.
  Status take_unreported();

 private:
  static constexpr int64_t kAll = std::numeric_limits<int64_t>::max();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t upto_ = kAll;
  bool running_ = false;
  Status status_;
  bool reported_ = true;  // status_ has been returned by wait_until (or is Ok)
};

}  // namespace zoe

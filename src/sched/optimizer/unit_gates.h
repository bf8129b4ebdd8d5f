// UnitGates: which units' gradients are final, for an optimizer pass that begins during the
// backward (zoe.update_in_backward). The caller opens unit u once its owned gradient chunk holds
// the step's last reduction; the pass waits at each unit's gate before stepping it. cancel()
// releases a waiting pass with an error (a step that will not be applied, an engine going away).
//
// Threads: the caller opens, resets and cancels; the pass's worker waits.
#pragma once
#include <condition_variable>
#include <mutex>
#include <vector>

#include "zoe/status.h"

namespace zoe {

class UnitGates {
 public:
  void reset(int units);         // all closed, not cancelled
  void open(int u);              // no-op when already open
  void open_all();
  void cancel();                 // every wait returns an error from now until reset
  bool is_open(int u) const;
  Status wait(int u);            // until u is open (Ok) or the gates are cancelled (an error)

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> open_;
  bool cancelled_ = false;
};

}  // namespace zoe

// UnitLoad: this rank's chunk of one unit on its way from its home tier into a gather buffer.
// The seam between UnitScheduler (which decides when loads start and finish) and ChunkLoad
// (which moves the bytes); tests put a fake on a virtual clock in its place.
#pragma once
#include "zoe/device.h"

namespace zoe {

class UnitLoad {
 public:
  virtual ~UnitLoad() = default;  // waits for what it issued
  // Issues what can start now; never blocks on the pinned pool.
  virtual Status start() = 0;
  // After it the chunk is in the destination (start() if it never ran).
  virtual Status finish() = 0;
  // The same for work queued on the compute stream after it: where the load allows, that stream
  // waits for the copies and the host does not (a fetch that blocked the host until its upload
  // landed left a GPU idle while the host woke and queued the next kernels).
  virtual Status finish_for_compute() { return finish(); }
  // Parts in device or host memory, which need the destination at start() (cannot be staged).
  virtual bool has_memory_parts() const = 0;
  // Whether start() issued any read / every read (finish() then waits for no pinned window).
  virtual bool reading() const = 0;
  virtual bool all_issued() const = 0;
  // A staged load (started without a destination) gets its gather buffer before finish().
  virtual void set_destination(const Buffer& dst) = 0;
};

}  // namespace zoe

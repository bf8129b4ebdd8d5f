// Where micro-batches come from. Sequential, with a position that checkpoints save and restore.
// Rank r of N reads the micro-batches r, r+N, r+2N, ... of one global sequence (llm.c order).
#pragma once
#include <cstdint>
#include <memory>

#include "common/config.h"
#include "model/model.h"
#include "zoe/status.h"

namespace zoe {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Result<Batch> next() = 0;
  virtual int64_t position() const = 0;           // micro-batches consumed by this rank
  virtual Status seek(int64_t position) = 0;      // resume after `position` micro-batches
};

// The MLP task's synthetic samples: micro-batch k of rank r covers samples (k*N + r)*B ... +B-1.
std::unique_ptr<BatchSource> make_synthetic_source(int micro_batch, int rank, int world);

}  // namespace zoe

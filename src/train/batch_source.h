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
  // Where the next global micro-batch round starts; the same value on every rank, so it resumes on
  // any rank count.
  virtual int64_t position() const = 0;
  virtual Status seek(int64_t position) = 0;
};

// The MLP task's synthetic samples: round k of rank r covers samples (k*N + r)*B ... +B-1.
std::unique_ptr<BatchSource> make_synthetic_source(int micro_batch, int rank, int world);

}  // namespace zoe

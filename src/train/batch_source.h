// Where micro-batches come from. Sequential, with a position that checkpoints save and restore.
// Rank r of N reads the micro-batches r, r+N, r+2N, ... of one global sequence (llm.c order).
#pragma once
#include <cstdint>
#include <memory>

#include "common/config.h"
#include "model/model.h"
#include "zoe/status.h"

namespace zoe {

// Where the next global micro-batch round starts: the same on every rank, so a checkpoint resumes
// on any rank count. Token sources: a shard and a token offset; the synthetic task: a sample index.
struct DataPosition {
  uint64_t shard = 0;
  int64_t offset = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Result<Batch> next() = 0;
  virtual DataPosition position() const = 0;
  virtual Status seek(const DataPosition& p) = 0;
};

// The MLP task's synthetic samples: round k of rank r covers samples (k*N + r)*B ... +B-1.
// `first_sample` offsets the whole sequence (a validation set disjoint from training).
std::unique_ptr<BatchSource> make_synthetic_source(int micro_batch, int rank, int world, int64_t first_sample = 0);
// llm.c batching over a bytes file or llmc shards (data/data_loader.h).
Result<std::unique_ptr<BatchSource>> make_token_source(const std::string& pattern, const std::string& format,
                                                       int vocab_size, int B, int T, int rank, int world);

}  // namespace zoe

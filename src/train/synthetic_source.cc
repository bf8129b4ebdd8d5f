#include "train/batch_source.h"

namespace zoe {
namespace {

// The position is the global index of the next micro-batch round's first sample: the same on
// every rank, so a checkpoint resumes on any rank count.
class SyntheticSource final : public BatchSource {
 public:
  SyntheticSource(int b, int rank, int world, int64_t first) : b_(b), rank_(rank), world_(world), next_(first) {}
  Result<Batch> next() override {
    Batch out;
    out.B = b_;
    out.T = 1;
    out.first_sample = next_ + int64_t{rank_} * b_;
    next_ += int64_t{world_} * b_;
    return out;
  }
  DataPosition position() const override { return {0, next_}; }
  Status seek(const DataPosition& p) override {
    next_ = p.offset;
    return Status::Ok();
  }

 private:
  int b_, rank_, world_;
  int64_t next_;
};

}  // namespace

std::unique_ptr<BatchSource> make_synthetic_source(int micro_batch, int rank, int world, int64_t first_sample) {
  return std::make_unique<SyntheticSource>(micro_batch, rank, world, first_sample);
}

}  // namespace zoe

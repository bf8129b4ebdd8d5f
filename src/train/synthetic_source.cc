#include "train/batch_source.h"

namespace zoe {
namespace {

// The position is the global index of the next micro-batch round's first sample: the same on
// every rank, so a checkpoint resumes on any rank count.
class SyntheticSource final : public BatchSource {
 public:
  SyntheticSource(int b, int rank, int world) : b_(b), rank_(rank), world_(world) {}
  Result<Batch> next() override {
    Batch out;
    out.B = b_;
    out.T = 1;
    out.first_sample = next_ + int64_t{rank_} * b_;
    next_ += int64_t{world_} * b_;
    return out;
  }
  int64_t position() const override { return next_; }
  Status seek(int64_t p) override {
    next_ = p;
    return Status::Ok();
  }

 private:
  int b_, rank_, world_;
  int64_t next_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> make_synthetic_source(int micro_batch, int rank, int world) {
  return std::make_unique<SyntheticSource>(micro_batch, rank, world);
}

}  // namespace zoe

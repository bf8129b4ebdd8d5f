#include "train/batch_source.h"

namespace zoe {
namespace {

class SyntheticSource final : public BatchSource {
 public:
  SyntheticSource(int b, int rank, int world) : b_(b), rank_(rank), world_(world) {}
  Result<Batch> next() override {
    Batch out;
    out.B = b_;
    out.T = 1;
    out.first_sample = (k_ * world_ + rank_) * b_;
    ++k_;
    return out;
  }
  int64_t position() const override { return k_; }
  Status seek(int64_t p) override {
    k_ = p;
    return Status::Ok();
  }

 private:
  int b_, rank_, world_;
  int64_t k_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> make_synthetic_source(int micro_batch, int rank, int world) {
  return std::make_unique<SyntheticSource>(micro_batch, rank, world);
}

}  // namespace zoe

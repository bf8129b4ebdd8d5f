// The one-rank communicator: collectives are copies and nothing goes on the wire.
#include <cstring>

#include "comm/comm.h"
#include "zoe/device.h"

namespace zoe {
namespace {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  // Tensor traffic is the paired device's own copy and reduction (host memory without one).
  Status all_gather(const void* send, void* recv, size_t chunk_bytes) override {
    if (send == recv) return Status::Ok();
    if (device_) return device_->copy(recv, send, chunk_bytes, Stream::kCompute);
    std::memmove(recv, send, chunk_bytes);
    return Status::Ok();
  }
  Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    if (send == recv) return Status::Ok();  // the sum of one chunk, in place: itself
    if (device_) return device_->sum_chunks(recv, send, 1, count, dtype);
    sum_chunks_in_order(send, 1, count, dtype, recv);
    return Status::Ok();
  }
  Status all_reduce_sum(double*, size_t) override { return Status::Ok(); }
  Status broadcast(void*, size_t, int) override { return Status::Ok(); }
  Status barrier() override { return Status::Ok(); }
  Status gather_to_root(const void* send, void* recv, size_t bytes) override {
    if (send != recv) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  Status all_gather_control(const void* send, void* recv, size_t bytes) override {
    return gather_to_root(send, recv, bytes);
  }
  bool barrier_within(double) override { return true; }
  Result<std::unique_ptr<Comm>> duplicate() override {
    auto d = std::make_unique<SelfComm>();
    d->set_device(device_);
    return std::unique_ptr<Comm>(std::move(d));
  }
};

}  // namespace

std::unique_ptr<Comm> make_self_comm() { return std::make_unique<SelfComm>(); }

}  // namespace zoe

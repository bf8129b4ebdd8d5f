#include "plan/virtual_mover.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace zoe {
namespace {

class VirtualLoad final : public UnitLoad {
 public:
  VirtualLoad(VirtualMover& m, int u, const Buffer& dst) : m_(m), u_(u), dst_(dst) {}
  Status start() override {
    if (started_) return Status::Ok();
    started_ = true;
    m_.loads.push_back(u_);
    m_.clock.io_free = std::max(m_.clock.io_free, m_.clock.now) + m_.load_s[u_];
    ready_ = m_.clock.io_free;
    return Status::Ok();
  }
  Status finish() override {
    ZOE_RETURN_IF_ERROR(start());
    if (!dst_) return Status::Runtime("a load finished without a destination");
    m_.clock.now = std::max(m_.clock.now, ready_);
    if (m_.mark) {
      const int32_t mark = u_;
      std::memcpy(dst_.data, &mark, sizeof(mark));
    }
    return Status::Ok();
  }
  bool has_memory_parts() const override { return m_.memory_parts[u_]; }
  bool reading() const override { return started_; }
  bool all_issued() const override { return started_; }
  void set_destination(const Buffer& dst) override { dst_ = dst; }

 private:
  VirtualMover& m_;
  int u_;
  Buffer dst_;
  bool started_ = false;
  double ready_ = 0;
};

}  // namespace

std::unique_ptr<UnitLoad> VirtualMover::load(int u, const Buffer& dst) {
  return std::make_unique<VirtualLoad>(*this, u, dst);
}

}  // namespace zoe

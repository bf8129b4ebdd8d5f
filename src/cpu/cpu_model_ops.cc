#include "cpu/cpu_model_ops.h"

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cpu/cpu_device.h"
#include "ops/gpt2_ops.h"

namespace zoe {
namespace {

class CpuModelOps final : public ModelOps {
 public:
  explicit CpuModelOps(CpuDevice& d) : d_(d) {}

  std::map<std::string, double> take_op_seconds() override {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(seconds_, {});
  }

  // Each op: its pointers checked and the fence open (Guard), then the reference itself.
#define ZOE_UNPAREN(...) __VA_ARGS__
#define ZOE_OP(name, params, args, ptrs) \
  void name params override {            \
    Guard g(this, #name, {ZOE_UNPAREN ptrs}); \
    gpt2::name args;                     \
  }
#include "ops/model_ops.def"
#undef ZOE_OP
#undef ZOE_UNPAREN

 private:
  // Checks the op's pointers (null ones are skipped: optional outputs), then keeps the fence
  // open for the op and times it. An unreachable pointer is a bug in the model: it stops the
  // process with the op's name, as a GPU kernel reading host memory would fault.
  class Guard {
   public:
    Guard(CpuModelOps* o, const char* op, std::initializer_list<const void*> ptrs)
        : o_(o), op_(op), open_(o->d_.fence()), start_(std::chrono::steady_clock::now()) {
      for (const void* p : ptrs) {
        if (!p) continue;
        Status st = o->d_.check_reachable(p, 1, op);
        if (!st.ok()) {
          std::fprintf(stderr, "zoe: %s\n", st.message().c_str());
          std::abort();
        }
      }
    }

    ~Guard() {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      std::lock_guard<std::mutex> l(o_->mu_);
      o_->seconds_[op_] += s;
    }

   private:
    CpuModelOps* o_;
    const char* op_;
    MemoryFence::Open open_;
    std::chrono::steady_clock::time_point start_;
  };

  CpuDevice& d_;
  std::mutex mu_;  // one model calls at a time; the lock keeps a bench's reads safe anyway
  std::map<std::string, double> seconds_;
};

}  // namespace

std::unique_ptr<ModelOps> make_cpu_model_ops(CpuDevice& dev) { return std::make_unique<CpuModelOps>(dev); }

}  // namespace zoe

#include "kernels/gemm_onednn.h"

namespace zoe::onednn {

bool supported(bool) { return false; }
std::string isa() { return "absent"; }
Status matmul(bool, const GemmShape&, const void*, const void*, float, void*, bool, const float*, int) {
  return Status::Unsupported("this build has no oneDNN (ZOE_ONEDNN)");
}

}  // namespace zoe::onednn

// CudnnAttention in a build without cuDNN (CMakeLists.txt: ZOE_CUDNN, and always on the
// emulation): nothing is created, and CudaModelOps runs zoe's own attention kernels.
#include "gpu/cudnn_attention.h"

namespace zoe::gpu {

namespace {
const char kAbsent[] =
    "this build has no cuDNN (CMake's ZOE_CUDNN: cuDNN 9's cudnn.h and library, and its frontend's headers from "
    "tools/cudnn-frontend.sh)";
}  // namespace

struct CudnnAttention::Impl {};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

Status CudnnAttention::create(cudaStream_t, RawMemory, std::unique_ptr<CudnnAttention>*) { return Status::Unsupported(kAbsent); }
Status CudnnAttention::prepare(int, int, int, int) { return Status::Unsupported(kAbsent); }
Status CudnnAttention::forward(uint16_t*, float*, const uint16_t*, int, int, int, int) {
  return Status::Unsupported(kAbsent);
}
Status CudnnAttention::backward(uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*, const float*, int, int,
                                int, int) {
  return Status::Unsupported(kAbsent);
}
size_t CudnnAttention::workspace_bytes() const { return 0; }
std::string CudnnAttention::version_text() { return kAbsent; }
Status CudnnAttention::validate(int, int, int, int, int) { return Status::Unsupported(kAbsent); }

}  // namespace zoe::gpu

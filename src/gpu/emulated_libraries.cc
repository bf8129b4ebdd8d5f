// The emulated build's stand-ins for the library loaders (cublaslt_library.cc, nccl_library.cc):
// tools/cuda_emu itself provides cuBLASLt's and NCCL's functions, so nothing is loaded.
#include "gpu/cublaslt_library.h"
#include "gpu/nccl_library.h"

namespace zoe::gpu {

bool cublaslt_loaded() { return false; }
std::string cublaslt_text() { return "cuBLASLt emulated (tools/cuda_emu)"; }
bool nccl_loaded() { return false; }
std::string nccl_text() { return "NCCL emulated (tools/cuda_emu)"; }

}  // namespace zoe::gpu

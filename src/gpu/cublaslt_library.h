// cuBLASLt, loaded at its first call (cublaslt_library.cc defines its entry points; LazyLibrary).
#pragma once

namespace zoe::gpu {

// Whether this process has loaded cuBLASLt yet (a process that never calls it never does).
bool cublaslt_loaded();

}  // namespace zoe::gpu

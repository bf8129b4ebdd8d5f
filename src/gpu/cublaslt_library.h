// cuBLASLt, loaded at its first call (cublaslt_library.cc defines its entry points; LazyLibrary).
#pragma once

#include <string>

namespace zoe::gpu {

// Whether this process has loaded cuBLASLt yet (a process that never calls it never does).
bool cublaslt_loaded();
// "cuBLASLt 13.1.0 (/path/libcublasLt.so.13)", loading it; or why it does not load.
std::string cublaslt_text();

}  // namespace zoe::gpu

// NCCL, loaded at its first call (nccl_library.cc defines its entry points; LazyLibrary): a job on
// one GPU never calls it, so it runs where NCCL is not installed.
#pragma once

#include <string>

namespace zoe::gpu {

// Whether this process has loaded NCCL yet.
bool nccl_loaded();
// "NCCL 2.28.3 (/path/libnccl.so.2)", loading it; or why it does not load.
std::string nccl_text();

}  // namespace zoe::gpu

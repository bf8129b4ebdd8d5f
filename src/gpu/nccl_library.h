// NCCL, loaded at its first call (nccl_library.cc defines its entry points; LazyLibrary): a job on
// one GPU never calls it, so it runs where NCCL is not installed.
#pragma once

namespace zoe::gpu {

// Whether this process has loaded NCCL yet.
bool nccl_loaded();

}  // namespace zoe::gpu

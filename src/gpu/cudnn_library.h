// cuDNN, loaded at its first call (cudnn_library.cc defines the entry points zoe and cuDNN's
// frontend call; LazyLibrary): where it cannot load, the bf16 attention runs on zoe's own kernels.
#pragma once

#include <string>

namespace zoe::gpu {

// Whether this process has loaded cuDNN yet.
bool cudnn_loaded();
// Why cuDNN could not be loaded ("" where it was, or has not been tried).
std::string cudnn_load_error();
// The file loaded ("" while not loaded).
std::string cudnn_path();

}  // namespace zoe::gpu

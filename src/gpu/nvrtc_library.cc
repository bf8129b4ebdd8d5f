// NVRTC's entry points that cuDNN's C++ frontend calls (its run-time-compiled engines; none of
// them runs GPT-2's attention on Hopper), defined here so that a build with cuDNN loads NVRTC only
// if they are called (LazyLibrary says why). The signatures are nvrtc.h's. Where NVRTC cannot be
// loaded, a call returns NVRTC_ERROR_INTERNAL_ERROR (as the frontend's own dynamic loading does).
#include <nvrtc.h>

#include "gpu/lazy_library.h"

namespace zoe::gpu {
namespace {

LazyLibrary& library() {
  static LazyLibrary lib(LazyLibrary::candidates("ZOE_NVRTC_LIBRARY", ZOE_NVRTC_PATH, ZOE_NVRTC_SONAME));
  return lib;
}

}  // namespace
}  // namespace zoe::gpu

#define ZOE_NVRTC_FORWARD(name, ...) \
  ZOE_LAZY_FORWARD(zoe::gpu::library(), NVRTC_ERROR_INTERNAL_ERROR, name, __VA_ARGS__)

extern "C" {

nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int num_headers,
                               const char* const* headers, const char* const* include_names) {
  ZOE_NVRTC_FORWARD(nvrtcCreateProgram, prog, src, name, num_headers, headers, include_names);
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) { ZOE_NVRTC_FORWARD(nvrtcDestroyProgram, prog); }

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int num_options, const char* const* options) {
  ZOE_NVRTC_FORWARD(nvrtcCompileProgram, prog, num_options, options);
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* size) { ZOE_NVRTC_FORWARD(nvrtcGetCUBINSize, prog, size); }

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) { ZOE_NVRTC_FORWARD(nvrtcGetCUBIN, prog, cubin); }

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* size) {
  ZOE_NVRTC_FORWARD(nvrtcGetProgramLogSize, prog, size);
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) { ZOE_NVRTC_FORWARD(nvrtcGetProgramLog, prog, log); }

}  // extern "C"

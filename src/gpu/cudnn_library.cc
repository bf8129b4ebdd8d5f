// cuDNN's entry points that zoe (cudnn_attention.cc) and cuDNN's C++ frontend (in its default
// mode, which calls the library by name) call, defined here so that the library loads at the first
// call, not with every process that links the CUDA backend (LazyLibrary says why). The signatures
// are cudnn_graph.h's: a mismatch is a compile error, and a function the frontend starts to call is
// an undefined symbol at link time. Where cuDNN cannot be loaded, a call returns
// CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED and cudnnGetErrorString names the file and the reason: the
// attention's cudnnCreate fails with it, and zoe's own kernels run the attention.
#include "gpu/cudnn_library.h"

#include <cudnn.h>

#include <algorithm>
#include <cstring>

#include "gpu/lazy_library.h"

#define ZOE_STR2(x) #x
#define ZOE_STR(x) ZOE_STR2(x)

namespace zoe::gpu {
namespace {

LazyLibrary& library() {
  static LazyLibrary lib(LazyLibrary::candidates("ZOE_CUDNN_LIBRARY", ZOE_CUDNN_PATH, "libcudnn.so." ZOE_STR(CUDNN_MAJOR)));
  return lib;
}

}  // namespace

bool cudnn_loaded() { return library().loaded(); }
std::string cudnn_load_error() { return library().error(); }
std::string cudnn_path() { return library().path(); }

}  // namespace zoe::gpu

#define ZOE_CUDNN_FORWARD(name, ...) \
  ZOE_LAZY_FORWARD(zoe::gpu::library(), CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, name, __VA_ARGS__)

extern "C" {

size_t cudnnGetVersion(void) { ZOE_LAZY_FORWARD(zoe::gpu::library(), 0, cudnnGetVersion); }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  static auto* const real = zoe::gpu::library().function<decltype(cudnnGetErrorString)>("cudnnGetErrorString");
  return real ? real(status) : zoe::gpu::library().error_text();
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  static auto* const real = zoe::gpu::library().function<decltype(cudnnGetLastErrorString)>("cudnnGetLastErrorString");
  if (real) return real(message, max_size);
  if (message == nullptr || max_size == 0) return;
  const char* why = zoe::gpu::library().error_text();
  const size_t n = std::min(std::strlen(why), max_size - 1);
  std::memcpy(message, why, n);
  message[n] = '\0';
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) { ZOE_CUDNN_FORWARD(cudnnCreate, handle); }

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) { ZOE_CUDNN_FORWARD(cudnnDestroy, handle); }

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  ZOE_CUDNN_FORWARD(cudnnSetStream, handle, stream);
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  ZOE_CUDNN_FORWARD(cudnnGetStream, handle, stream);
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* descriptor) {
  ZOE_CUDNN_FORWARD(cudnnBackendCreateDescriptor, type, descriptor);
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  ZOE_CUDNN_FORWARD(cudnnBackendDestroyDescriptor, descriptor);
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  ZOE_CUDNN_FORWARD(cudnnBackendFinalize, descriptor);
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void* elements) {
  ZOE_CUDNN_FORWARD(cudnnBackendSetAttribute, descriptor, name, type, count, elements);
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                                       void* elements) {
  ZOE_CUDNN_FORWARD(cudnnBackendGetAttribute, descriptor, name, type, requested, count, elements);
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t variant_pack) {
  ZOE_CUDNN_FORWARD(cudnnBackendExecute, handle, plan, variant_pack);
}

}  // extern "C"

// cuBLASLt's entry points that zoe calls, defined here so that the library loads at the first call
// rather than with every process that links the CUDA backend (LazyLibrary says why). Each resolves
// the library's own function once and forwards to it. The signatures are cublasLt.h's: a mismatch
// is a compile error. Where the library cannot be loaded, a call returns
// CUBLAS_STATUS_NOT_INITIALIZED and cublasLtGetStatusString says what failed to load.
#include "gpu/cublaslt_library.h"

#include <cublasLt.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/lazy_library.h"

#define ZOE_STR2(x) #x
#define ZOE_STR(x) ZOE_STR2(x)

namespace zoe::gpu {
namespace {

// $ZOE_CUBLASLT_LIBRARY alone where set (a file elsewhere); else the file this build found, then
// whatever the loader finds by the versioned name.
std::vector<std::string> cublaslt_paths() {
  if (const char* p = std::getenv("ZOE_CUBLASLT_LIBRARY"); p && *p) return {p};
  return {ZOE_CUBLASLT_PATH, "libcublasLt.so." ZOE_STR(CUBLAS_VER_MAJOR)};
}

LazyLibrary& library() {
  static LazyLibrary lib(cublaslt_paths());
  return lib;
}

template <typename F>
F* resolve(const char* name) {
  return reinterpret_cast<F*>(library().symbol(name));
}

// The library's `name`, resolved at the first call; a call with `args` (a cublasStatus_t result).
#define ZOE_CUBLASLT_FORWARD(name, ...)                       \
  static auto* const real = resolve<decltype(name)>(#name);   \
  if (real == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED; \
  return real(__VA_ARGS__)

}  // namespace

bool cublaslt_loaded() { return library().loaded(); }

}  // namespace zoe::gpu

using zoe::gpu::resolve;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) { ZOE_CUBLASLT_FORWARD(cublasLtCreate, handle); }

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) { ZOE_CUBLASLT_FORWARD(cublasLtDestroy, handle); }

size_t cublasLtGetVersion(void) {
  static auto* const real = resolve<decltype(cublasLtGetVersion)>("cublasLtGetVersion");
  return real ? real() : 0;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  static auto* const real = resolve<decltype(cublasLtGetStatusName)>("cublasLtGetStatusName");
  if (real) return real(status);
  return status == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED" : "CUBLAS_STATUS_(unknown)";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  static auto* const real = resolve<decltype(cublasLtGetStatusString)>("cublasLtGetStatusString");
  if (real) return real(status);
  static thread_local std::string why;  // the pointer stays valid until this thread's next call
  why = zoe::gpu::library().error();
  return why.c_str();
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmul, handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                       workspace, workspace_bytes, stream);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmulAlgoGetHeuristic, handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference,
                       requested, results, returned);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmulDescCreate, desc, compute, scale);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmulDescDestroy, desc);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmulPreferenceCreate, pref);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmulPreferenceDestroy, pref);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  ZOE_CUBLASLT_FORWARD(cublasLtMatrixLayoutDestroy, layout);
}

}  // extern "C"

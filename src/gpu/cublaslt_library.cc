// cuBLASLt's entry points that zoe calls, defined here so that the library loads at the first call
// rather than with every process that links the CUDA backend (LazyLibrary says why). Each resolves
// the library's own function once and forwards to it. The signatures are cublasLt.h's: a mismatch
// is a compile error. Where the library cannot be loaded, a call returns
// CUBLAS_STATUS_NOT_INITIALIZED and cublasLtGetStatusString says what failed to load.
#include "gpu/cublaslt_library.h"

#include <cublasLt.h>

#include "gpu/lazy_library.h"

#define ZOE_STR2(x) #x
#define ZOE_STR(x) ZOE_STR2(x)

namespace zoe::gpu {
namespace {

LazyLibrary& library() {
  static LazyLibrary lib(
      LazyLibrary::candidates("ZOE_CUBLASLT_LIBRARY", ZOE_CUBLASLT_PATH, "libcublasLt.so." ZOE_STR(CUBLAS_VER_MAJOR)));
  return lib;
}

}  // namespace

bool cublaslt_loaded() { return library().loaded(); }
std::string cublaslt_text() { return library().describe("cuBLASLt", static_cast<long>(cublasLtGetVersion())); }

}  // namespace zoe::gpu

#define ZOE_CUBLASLT_FORWARD(name, ...) \
  ZOE_LAZY_FORWARD(zoe::gpu::library(), CUBLAS_STATUS_NOT_INITIALIZED, name, __VA_ARGS__)

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) { ZOE_CUBLASLT_FORWARD(cublasLtCreate, handle); }

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) { ZOE_CUBLASLT_FORWARD(cublasLtDestroy, handle); }

size_t cublasLtGetVersion(void) { ZOE_LAZY_FORWARD(zoe::gpu::library(), 0, cublasLtGetVersion); }

const char* cublasLtGetStatusName(cublasStatus_t status) {
  static auto* const real = zoe::gpu::library().function<decltype(cublasLtGetStatusName)>("cublasLtGetStatusName");
  if (real) return real(status);
  return status == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED" : "CUBLAS_STATUS_(unknown)";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  static auto* const real = zoe::gpu::library().function<decltype(cublasLtGetStatusString)>("cublasLtGetStatusString");
  return real ? real(status) : zoe::gpu::library().error_text();
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

// cuBLASLt behind the same calls: a column-major GEMM (fp32, TF32-rounded fp32, or bf16 widened
// exactly, into fp32 or, bf16 operands, rounded to bf16; the product by OpenBLAS) with the
// epilogues zoe asks for: BIAS (an fp32 vector added to each column of D), GELU_AUX_BIAS (then
// GELU, tanh form, with the pre-GELU values stored rounded as D is into the aux matrix) and
// DGELU_BGRAD (the product times GELU' of the aux matrix, and the fp32 bias gradient: each row's
// sum of those values before D's rounding, written). Vectors and the aux matrix are read or
// written 16 bytes at a time (so 16-byte aligned), the aux's leading dimension a multiple of 8 no
// less than D's rows, as cuBLASLt requires. It checks that the layouts make a product and that
// the pointers keep the alignments promised to the heuristic; a matmul is queued on its stream
// like a kernel.
#include "cuda_emu_internal.h"  // first: cuda_emu.h defines the CUDA qualifiers before the CUDA headers do

#include <cblas.h>
#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

struct DescData {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int32_t bias_type = -1;  // -1: D's type, as cuBLASLt's default
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  int32_t aux_type = -1;  // -1: D's type
};

bool has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool has_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

// GELU, tanh form (GPT-2's, and what PyTorch runs where cuBLASLt's epilogue is not used), and
// its derivative, in fp32.
constexpr float kGeluScale = 0.7978845608028654f, kGeluCube = 0.044715f;
float gelu(float x) { return 0.5f * x * (1.f + std::tanh(kGeluScale * (x + kGeluCube * x * x * x))); }
float gelu_grad(float x) {
  const float t = std::tanh(kGeluScale * (x + kGeluCube * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluScale * (1.f + 3.f * kGeluCube * x * x);
}
struct LayoutData {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct PrefData {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};
struct AlgoData {
  uint32_t align[4];
};
static_assert(sizeof(DescData) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(LayoutData) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(PrefData) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(AlgoData) <= sizeof(cublasLtMatmulAlgo_t));

template <class D, class O>
D* data(O* o) {
  return reinterpret_cast<D*>(o);
}
int g_handle;

// An attribute's value into its field, whose size the value must have.
template <class T>
cublasStatus_t set(T* field, const void* buf, size_t size) {
  if (size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al) al >>= 1;
  return al;
}

// The elements a matrix of `l` spans, in bytes.
size_t span_bytes(const LayoutData& l) {
  const size_t elem = l.type == CUDA_R_16BF ? 2 : 4;
  return l.cols == 0 ? 0 : ((l.cols - 1) * static_cast<size_t>(l.ld) + l.rows) * elem;
}

// x rounded to TF32 (8 exponent bits, 10 mantissa bits), to nearest with ties to even, as the
// tensor cores read fp32 operands under CUBLAS_COMPUTE_32F_FAST_TF32 (NaN and infinity kept).
float to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

// D = alpha op(A) op(B) + beta C, column-major, on the worker (descriptors copied at the call).
void gemm(DescData o, LayoutData A, LayoutData B, LayoutData Cl, LayoutData Dl, float alpha, float beta, const void* Ap,
          const void* Bp, const void* Cp, void* Dp) {
  // Element x of a matrix of `type` (fp32, or bf16 widened exactly).
  const bool tf32 = o.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  auto element = [](const void* p, cudaDataType_t type, int64_t x) {
    if (type != CUDA_R_16BF) return static_cast<const float*>(p)[x];
    const uint32_t u = uint32_t{static_cast<const uint16_t*>(p)[x]} << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  // An operand as the product reads it: fp32 rounded to TF32 under the TF32 compute type.
  auto load = [tf32, element](const void* p, cudaDataType_t type, int64_t x) {
    const float f = element(p, type, x);
    return tf32 && type != CUDA_R_16BF ? to_tf32(f) : f;
  };
  const auto* Cf = static_cast<const float*>(Cp);
  const bool bgrad = o.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  const auto* bias = static_cast<const float*>(has_bias(o.epilogue) && !bgrad ? o.bias : nullptr);
  const int64_t m = Dl.rows, n = Dl.cols;
  const int64_t k = o.ta == CUBLAS_OP_N ? A.cols : A.rows;
  // op(A) and op(B) as dense column-major fp32 (widened, TF32-rounded), then one OpenBLAS sgemm:
  // the operands are read as cuBLASLt reads them, the product in fp32 in some order, as on a GPU
  // (whose sums run in an order of its own too).
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), d(static_cast<size_t>(m * n));
  for (int64_t p = 0; p < k; p++)
    for (int64_t i = 0; i < m; i++) a[p * m + i] = load(Ap, A.type, o.ta == CUBLAS_OP_N ? p * A.ld + i : i * A.ld + p);
  for (int64_t j = 0; j < n; j++)
    for (int64_t p = 0; p < k; p++) b[j * k + p] = load(Bp, B.type, o.tb == CUBLAS_OP_N ? j * B.ld + p : p * B.ld + j);
  if (m > 0 && n > 0 && k > 0)
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), alpha, a.data(), static_cast<blasint>(m), b.data(), static_cast<blasint>(k),
                0.f, d.data(), static_cast<blasint>(m));
  // An element of D's type (the aux matrix has D's type too), stored.
  const bool d16 = Dl.type == CUDA_R_16BF;
  auto store = [d16](void* p, int64_t x, float v) {
    if (d16) static_cast<uint16_t*>(p)[x] = emu::round_bf16(v);
    else static_cast<float*>(p)[x] = v;
  };
  // beta C (fp32 only: a bf16 D is written with beta 0), then the bias, then the GELU epilogues
  // (GELU with its input into aux; or GELU' of aux, summed into the bias gradient), then D's rounding.
  std::vector<float> bias_grad(bgrad ? static_cast<size_t>(m) : 0, 0.f);
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      float v = d[j * m + i] + (beta != 0.f ? beta * Cf[j * Cl.ld + i] : 0.f);
      if (bias) v += bias[i];
      if (o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        store(const_cast<void*>(o.aux), j * o.aux_ld + i, v);
        v = gelu(v);
      } else if (bgrad) {
        v *= gelu_grad(element(o.aux, Dl.type, j * o.aux_ld + i));
        bias_grad[i] += v;
      }
      store(Dp, j * Dl.ld + i, v);
    }
  if (bgrad) std::memcpy(const_cast<void*>(o.bias), bias_grad.data(), bias_grad.size() * sizeof(float));
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (emu::injected("cublasLtCreate")) return CUBLAS_STATUS_NOT_INITIALIZED;
  *h = reinterpret_cast<cublasLtHandle_t>(&g_handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_EMU";
  }
}
const char* cublasLtGetStatusString(cublasStatus_t) { return "emulated cuBLASLt error"; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (emu::injected("cublasLtMatmulDescCreate")) return CUBLAS_STATUS_ALLOC_FAILED;
  *d = new cublasLtMatmulDescOpaque_t{};
  auto* x = data<DescData>(*d);
  *x = DescData{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  auto* x = data<DescData>(d);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(&x->ta, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(&x->tb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(&x->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(&x->bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(&x->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set(&x->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set(&x->aux_ld, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set(&x->aux_type, buf, size);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (ld < static_cast<int64_t>(rows)) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{};
  *data<LayoutData>(*l) = LayoutData{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  *data<PrefData>(*p) = PrefData{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  auto* x = data<PrefData>(p);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(&x->workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set(&x->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

// CUDA_EMU_LT_BIAS_IN_D_TYPE=heuristic|call: a cuBLASLt that takes an epilogue's vector only in
// D's type (its documented default) where D is bf16: its heuristic refuses an fp32 vector, or
// offers an algorithm and the call then refuses it (NOT_SUPPORTED). Unset: an fp32 vector with a
// bf16 D is taken, as the emulation's products compute it.
bool lt_refuses_bias_type(const DescData& o, cudaDataType_t d_type, const char* where) {
  const char* mode = std::getenv("CUDA_EMU_LT_BIAS_IN_D_TYPE");
  if (!mode || std::strcmp(mode, where) != 0 || !has_bias(o.epilogue)) return false;
  const int32_t bias_type = o.bias_type == -1 ? static_cast<int32_t>(d_type) : o.bias_type;
  return bias_type != static_cast<int32_t>(d_type);
}

// Checks that the layouts make a product: op(A) m x k, op(B) k x n, C = D m x n.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
  if (emu::injected("cublasLtMatmulAlgoGetHeuristic")) {
    *found = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const auto* o = data<DescData>(op);
  const auto *A = data<LayoutData>(a), *B = data<LayoutData>(b), *Cl = data<LayoutData>(c), *Dl = data<LayoutData>(d);
  if (o->compute != CUBLAS_COMPUTE_32F && o->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t m = Dl->rows, n = Dl->cols;
  const uint64_t am = o->ta == CUBLAS_OP_N ? A->rows : A->cols, ak = o->ta == CUBLAS_OP_N ? A->cols : A->rows;
  const uint64_t bk = o->tb == CUBLAS_OP_N ? B->rows : B->cols, bn = o->tb == CUBLAS_OP_N ? B->cols : B->rows;
  // The products zoe asks for: fp32 x fp32 or bf16 x bf16, into fp32 (or bf16 from bf16), C of
  // D's type (as cuBLASLt's tables allow); no epilogues but BIAS, GELU_AUX_BIAS and DGELU_BGRAD,
  // whose vector is fp32 and aux matrix of D's type, its leading dimension a multiple of 8 no
  // less than D's rows.
  const bool types_ok = A->type == B->type && (A->type == CUDA_R_32F || A->type == CUDA_R_16BF) &&
                        Cl->type == Dl->type && (Dl->type == CUDA_R_32F || (Dl->type == CUDA_R_16BF && A->type == CUDA_R_16BF)) &&
                        (A->type == CUDA_R_32F || o->compute == CUBLAS_COMPUTE_32F);
  const int32_t bias_type = o->bias_type == -1 ? static_cast<int32_t>(Dl->type) : o->bias_type;
  const int32_t aux_type = o->aux_type == -1 ? static_cast<int32_t>(Dl->type) : o->aux_type;
  const bool aux_ok = !has_aux(o->epilogue) ||
                      (aux_type == static_cast<int32_t>(Dl->type) && o->aux_ld % 8 == 0 &&
                       o->aux_ld >= static_cast<int64_t>(Dl->rows));
  const bool epilogue_ok = o->epilogue == CUBLASLT_EPILOGUE_DEFAULT ||
                           (has_bias(o->epilogue) && bias_type == CUDA_R_32F && aux_ok);
  if (!types_ok || !epilogue_ok || lt_refuses_bias_type(*o, Dl->type, "heuristic")) {
    *found = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // The heuristic weighs the vector's address, as it does the aux matrix's: both set before it.
  if ((has_bias(o->epilogue) && o->bias == nullptr) || (has_aux(o->epilogue) && o->aux == nullptr)) {
    std::fprintf(stderr, "cuda_emu: cublasLtMatmulAlgoGetHeuristic: the epilogue's %s pointer is unset\n",
                 o->bias == nullptr ? "bias" : "aux");
    *found = 0;
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (am != m || bn != n || ak != bk || Cl->rows != m || Cl->cols != n || requested < 1) {
    *found = 0;
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::memset(results, 0, sizeof *results);
  std::memcpy(data<AlgoData>(&results->algo)->align, data<PrefData>(pref)->align, sizeof(uint32_t) * 4);
  results->state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha_p, const void* Ap,
                              cublasLtMatrixLayout_t a, const void* Bp, cublasLtMatrixLayout_t b, const void* beta_p,
                              const void* Cp, cublasLtMatrixLayout_t c, void* Dp, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t stream) {
  if (emu::injected("cublasLtMatmul")) return CUBLAS_STATUS_EXECUTION_FAILED;
  const DescData o = *data<DescData>(op);
  const LayoutData A = *data<LayoutData>(a), B = *data<LayoutData>(b), Cl = *data<LayoutData>(c),
                   Dl = *data<LayoutData>(d);
  if (lt_refuses_bias_type(o, Dl.type, "call")) return CUBLAS_STATUS_NOT_SUPPORTED;
  const auto* al = data<AlgoData>(const_cast<cublasLtMatmulAlgo_t*>(algo))->align;
  const void* ptrs[4] = {Ap, Bp, Cp, Dp};
  for (int i = 0; i < 4; i++)
    if (alignment(ptrs[i]) < al[i]) {
      std::fprintf(stderr, "cuda_emu: matrix %c is %u-byte aligned, the plan promised %u\n", "ABCD"[i],
                   alignment(ptrs[i]), al[i]);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  // The scalars are read now (host pointer mode), the matrices and the bias (the pointer the
  // descriptor holds at the call) when the matmul runs.
  const float alpha = *static_cast<const float*>(alpha_p), beta = *static_cast<const float*>(beta_p);
  std::vector<emu::Range> uses = {{static_cast<const char*>(Ap), span_bytes(A), false},
                                  {static_cast<const char*>(Bp), span_bytes(B), false},
                                  {static_cast<const char*>(Dp), span_bytes(Dl), true}};
  if (beta != 0.f) uses.push_back({static_cast<const char*>(Cp), span_bytes(Cl), false});
  if (has_bias(o.epilogue)) {
    if (o.bias == nullptr || alignment(o.bias) < 16) {
      if (o.bias) std::fprintf(stderr, "cuda_emu: the epilogue's bias vector %p is not 16-byte aligned\n", o.bias);
      else std::fprintf(stderr, "cuda_emu: the epilogue has no bias vector (CUBLASLT_MATMUL_DESC_BIAS_POINTER unset)\n");
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    // DGELU_BGRAD writes the bias gradient; the others read the bias.
    uses.push_back({static_cast<const char*>(o.bias), Dl.rows * sizeof(float), o.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD});
  }
  if (has_aux(o.epilogue)) {
    if (o.aux == nullptr || alignment(o.aux) < 16) {
      if (o.aux) std::fprintf(stderr, "cuda_emu: the epilogue's aux matrix %p is not 16-byte aligned\n", o.aux);
      else std::fprintf(stderr, "cuda_emu: the epilogue has no aux matrix (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER unset)\n");
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    // GELU_AUX_BIAS writes the GELU input; DGELU_BGRAD reads it.
    const LayoutData aux{Dl.type, Dl.rows, Dl.cols, o.aux_ld};
    uses.push_back({static_cast<const char*>(o.aux), span_bytes(aux), o.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS});
  }
  emu::enqueue(stream, "cublasLtMatmul", std::move(uses),
               [=] { gemm(o, A, B, Cl, Dl, alpha, beta, Ap, Bp, Cp, Dp); });
  return CUBLAS_STATUS_SUCCESS;
}
}  // extern "C"

namespace emu {
uint16_t round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
}  // namespace emu

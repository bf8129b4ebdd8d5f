// CudaModelOps: launches of the kernels in cuda_model_kernels.cuh and the GEMMs through cuBLASLt;
// the attention's are in cuda_model_ops_attention.cu. See cuda_model_ops.h for the contract.
#include "gpu/cuda_model_ops.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/cuda_model_kernels.cuh"
#include "gpu/cuda_model_ops_util.h"
#include "gpu/cuda_op_timer.h"
#include "gpu/cudnn_attention.h"

namespace zoe::gpu {

namespace {

namespace k = kernels;

constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;  // what NVIDIA suggests for Hopper
constexpr size_t kMinScratchBytes = size_t{1} << 20;
constexpr int64_t kColChunkRows = 256;  // rows per partial of a column sum

// The largest power of two (at most 256) dividing the address: what cuBLASLt's heuristic must
// assume about a matrix (its default is 256, which offsets inside a flat buffer do not meet).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

}  // namespace

// ---- cuBLASLt -------------------------------------------------------------------------------------

// One cached matmul configuration: everything cuBLASLt needs but the pointers. The heuristic's
// choice depends on the shapes and the pointers' alignments, so those are the key; the same key
// always runs the same algorithm, which keeps results bitwise reproducible.
struct GemmKey {
  bool ta, tb, bf16;  // bf16: A and B are bf16
  int64_t m, n, k, lda, ldb, ldd;
  uint32_t align_a, align_b, align_d;
  GemmEpilogue epilogue = GemmEpilogue::kNone;  // with an fp32 vector
  bool d_bf16 = false;     // D rounded to bf16 by the epilogue (beta 0)
  uint32_t align_aux = 0;  // the aux matrix's alignment (GELU epilogues), or 0
  uint32_t align_bias = 0; // the vector's alignment (epilogues), or 0
  bool operator==(const GemmKey&) const = default;
};

struct GemmPlan {
  GemmKey key;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool supported = true;  // false: cuBLASLt has no algorithm for it, or refused it (kept, not asked again)
};

struct CudaModelOps::Gemm {
  using Plan = GemmPlan;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::vector<Plan> plans;

  static void destroy(Plan& p) {
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    p = Plan{};
  }
  ~Gemm() {  // (the workspace goes back first: CudaModelOps's memory)
    for (Plan& p : plans) destroy(p);
    if (handle) cublasLtDestroy(handle);
  }
};

namespace {

std::string cublas_text(const char* what, cublasStatus_t s) {
  return std::string(what) + ": cuBLASLt " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")";
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}
bool has_aux(GemmEpilogue e) {
  return e == GemmEpilogue::kGeluAuxBias || e == GemmEpilogue::kDGeluBGrad;
}

// Said once per epilogue: where cuBLASLt has no algorithm for one (an older library or GPU), or
// refuses the call its heuristic offered one for, its op runs as separate passes, slower but the
// same results to a rounding.
void note_no_epilogue(GemmEpilogue e, const std::string& where, const char* how = "has no") {
  static constexpr const char* kNames[] = {"no", "BIAS", "GELU_AUX_BIAS", "DGELU_BGRAD"};  // GemmEpilogue's order
  static std::once_flag told[std::size(kNames)];
  const int i = static_cast<int>(e);
  std::call_once(told[i], [&] {
    std::fprintf(stderr, "zoe: note: cuBLASLt %s %s epilogue for %s here; that op runs as separate passes\n", how,
                 kNames[i], where.c_str());
  });
}

}  // namespace

CudaModelOps::CudaModelOps(cudaStream_t compute_stream, bool allow_tf32, RawMemory memory)
    : stream_(compute_stream), allow_tf32_(allow_tf32), memory_(memory.malloc ? std::move(memory) : cuda_raw_memory()),
      gemm_(std::make_unique<Gemm>()) {
  if (const char* v = std::getenv("ZOE_CUDA_ATTENTION"); v && *v) {
    const std::string_view k = v;
    if (k == "auto") attention_kernels_ = AttentionKernels::kAuto;
    else if (k == "cudnn") attention_kernels_ = AttentionKernels::kCudnn;
    else if (k == "mma") attention_kernels_ = AttentionKernels::kTensorCores;
    else if (k == "fp32") attention_kernels_ = AttentionKernels::kFp32;
    else
      fail(Status::Invalid("ZOE_CUDA_ATTENTION='" + std::string(k) + "': expected auto, cudnn, mma or fp32"));
  }
  const cublasStatus_t s = cublasLtCreate(&gemm_->handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    gemm_->handle = nullptr;
    fail(Status::Runtime(cublas_text("cublasLtCreate", s)));
    return;
  }
  // A device (or budget) that cannot give 32 MiB at the start has no room to train: the error is
  // the ops' status, which the trainer reads before the first step.
  gemm_->workspace = take_memory(kGemmWorkspaceBytes, "the cuBLASLt workspace");
  if (gemm_->workspace) gemm_->workspace_bytes = kGemmWorkspaceBytes;
}

CudaModelOps::~CudaModelOps() {
  // Kernels enqueued earlier may still use the workspaces and scratch: let them finish first.
  cudnn_.reset();  // (it synchronizes before its workspace goes)
  if (scratch_[kOps] || scratch_[kHeld] || gemm_->workspace) cudaStreamSynchronize(stream_);
  for (void* p : scratch_)
    if (p) memory_.free(p);
  if (gemm_->workspace) memory_.free(gemm_->workspace);
  gemm_.reset();
}

void* CudaModelOps::take_memory(size_t bytes, const char* what) {
  void* p = nullptr;
  if (Status s = take_raw(memory_, bytes, what, &p); !s.ok()) fail(std::move(s));
  return p;
}

size_t CudaModelOps::workspace_bytes() const {
  return (gemm_ ? gemm_->workspace_bytes : 0) + scratch_bytes_[kOps] + scratch_bytes_[kHeld] +
         (cudnn_ ? cudnn_->workspace_bytes() : 0);
}

// An op run by another (zero inside matmul_backward) is named by its caller: only the outer
// scope registers. Nothing is formatted unless an error is recorded.
CudaModelOps::OpScope::OpScope(CudaModelOps* o, const char* op_name,
                               std::initializer_list<std::pair<const char*, int64_t>> sizes)
    : ops(o), name(op_name), n(std::min(sizes.size(), dims.size())) {
  std::copy_n(sizes.begin(), n, dims.begin());
  if (ops->op_) return;
  ops->op_ = this;
  if (ops->timer_) {
    Status s = ops->timer_->begin(ops->stream_);
    if (!s.ok()) ops->fail(std::move(s));
  }
}
CudaModelOps::OpScope::~OpScope() {
  if (ops->op_ != this) return;
  if (ops->timer_) {
    Status s = ops->timer_->end(name, ops->stream_);
    if (!s.ok()) ops->fail(std::move(s));
  }
  ops->op_ = nullptr;
}

std::map<std::string, double> CudaModelOps::take_op_seconds() {
  if (!timer_) {
    timer_ = std::make_unique<CudaOpTimer>();
    return {};
  }
  std::map<std::string, double> seconds;
  if (Status s = timer_->take(&seconds); !s.ok()) {
    fail(std::move(s));
    return {};
  }
  return seconds;
}
std::string CudaModelOps::OpScope::text() const {
  std::string s = std::string(name) + "(";
  for (size_t i = 0; i < n; i++) s += (i ? ", " : "") + std::string(dims[i].first) + " " + std::to_string(dims[i].second);
  return s + ")";
}

bool CudaModelOps::fail(Status s) {
  if (status_.ok()) static_cast<void>(status_ = s.prefixed(op_ ? op_->text() + ": " : ""));  // ([[nodiscard]])
  return false;
}

bool CudaModelOps::check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  return fail(Status::Runtime(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"));
}

bool CudaModelOps::check_launch(const char* what) { return check(cudaGetLastError(), what); }

void* CudaModelOps::scratch(size_t bytes, ScratchSlot slot) {
  void*& buf = scratch_[slot];
  size_t& have = scratch_bytes_[slot];
  if (buf && bytes <= have) return buf;
  if (buf) {
    // The old buffer may be in use by kernels still queued: wait for them (once per growth).
    if (!check(cudaStreamSynchronize(stream_), "synchronize before growing the scratch")) return nullptr;
    memory_.free(buf);
    buf = nullptr;
    have = 0;
  }
  const size_t want = (std::max(bytes, kMinScratchBytes) + kMinScratchBytes - 1) / kMinScratchBytes * kMinScratchBytes;
  buf = take_memory(want, "the ops scratch");
  if (buf) have = want;
  return buf;
}

// D[m x n] = op(A) op(B) + beta * D, column-major (cuBLAS's view), alpha 1. Every caller passes a
// contiguous D (ldd == m).
void CudaModelOps::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const float* A, int64_t lda,
                        const float* B, int64_t ldb, float* D, int64_t ldd, float beta, const char* what) {
  gemm_any(false, ta, tb, m, n, kk, A, lda, B, ldb, D, ldd, beta, what);
}

void CudaModelOps::gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const uint16_t* A, int64_t lda,
                             const uint16_t* B, int64_t ldb, float* D, int64_t ldd, float beta, const char* what) {
  gemm_any(true, ta, tb, m, n, kk, A, lda, B, ldb, D, ldd, beta, what);
}

void CudaModelOps::gemm_any(bool bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const void* A,
                            int64_t lda, const void* B, int64_t ldb, float* D, int64_t ldd, float beta,
                            const char* what) {
  if (m <= 0 || n <= 0) return;
  if (kk <= 0) {  // an empty sum: D = beta * D
    if (beta == 0.f) check(cudaMemsetAsync(D, 0, sizeof(float) * m * n, stream_), what);
    return;
  }
  const GemmKey key{ta, tb, bf16, m, n, kk, lda, ldb, ldd, alignment_of(A), alignment_of(B), alignment_of(D)};
  Gemm::Plan* plan = plan_for(key, what);
  if (!plan) return;
  if (!plan->supported) {
    fail(Status::Unsupported(shape_text(what, {m, n, kk, lda, ldb, ldd}) + ": cuBLASLt has no algorithm for this GEMM"));
    return;
  }
  static_cast<void>(run(*plan, A, B, beta, D, nullptr, nullptr, what));  // (a plain product never falls back)
}

bool CudaModelOps::gemm_fused(bool bf16, bool ta, int64_t m, int64_t n, int64_t kk, const void* A, int64_t lda,
                              const void* B, int64_t ldb, void* D, bool d_bf16, Epilogue e, const void* bias,
                              const void* aux, const char* what) {
  if (m <= 0 || n <= 0) return e != Epilogue::kDGeluBGrad;  // (a bias gradient is still to write)
  // An empty sum, or a vector or aux matrix cuBLASLt may not take (its epilogue reads and writes
  // them 16 bytes at a time; aux's leading dimension is m), or DGELU over one-term sums (which
  // cuBLASLt does not run): the caller's own passes.
  const bool vector_ok = e == Epilogue::kNone || (bias && alignment_of(bias) >= 16);
  const bool aux_ok = !has_aux(e) || (aux && alignment_of(aux) >= 16 && m % 8 == 0);
  if (kk <= 0 || (e == Epilogue::kDGeluBGrad && kk < 2) || !vector_ok || !aux_ok) return false;
  GemmKey key{ta, false, bf16, m, n, kk, lda, ldb, m, alignment_of(A), alignment_of(B), alignment_of(D)};
  key.epilogue = e;
  key.d_bf16 = d_bf16;
  key.align_aux = aux ? alignment_of(aux) : 0;
  key.align_bias = bias ? alignment_of(bias) : 0;
  Gemm::Plan* plan = plan_for(key, what, bias, aux);
  if (!plan) return true;  // the error is recorded
  if (!plan->supported) return false;
  return run(*plan, A, B, 0.f, D, bias, aux, what);
}

// The cached plan for key, made on first use: nullptr on an error (recorded); a plan with
// supported false where cuBLASLt's heuristic offers no algorithm.
GemmPlan* CudaModelOps::plan_for(const GemmKey& key, const char* what, const void* bias, const void* aux) {
  if (!gemm_->handle) {
    fail(Status::Runtime(std::string(what) + ": no cuBLASLt handle"));
    return nullptr;
  }
  for (Gemm::Plan& p : gemm_->plans)
    if (p.key == key) return &p;
  Gemm::Plan p;
  p.key = key;
  // Plain fp32 unless TF32 was asked for: CUBLAS_COMPUTE_32F never uses tensor cores on fp32
  // operands. bf16 operands accumulate in fp32 (on tensor cores).
  const cublasComputeType_t compute = allow_tf32_ && !key.bf16 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t ab = key.bf16 ? CUDA_R_16BF : CUDA_R_32F, dt = key.d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t opa = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t ws = gemm_->workspace_bytes;
  const int64_t m = key.m, n = key.n, kk = key.k;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t s = cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  if (key.epilogue != Epilogue::kNone) {  // the vector fp32 (a bias, or DGELU_BGRAD's gradient)
    const cublasLtEpilogue_t epilogue = lt_epilogue(key.epilogue);
    const int32_t bias_type = CUDA_R_32F;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    // Before the heuristic, which may read it (as PyTorch's and TransformerEngine's set it); each
    // call sets its own again.
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  }
  // GELU's input: D's shape, contiguous, and D's type (cuBLASLt's default for it: the type is
  // left unset, as a type set for a combination it lacks fails only at the call).
  if (has_aux(key.epilogue)) {
    const int64_t aux_ld = key.m;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
  }
  // Layouts describe the matrices as stored: op(A) is m x k, so A is k x m when transposed.
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p.a, ab, key.ta ? kk : m, key.ta ? m : kk, key.lda);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p.b, ab, key.tb ? n : kk, key.tb ? kk : n, key.ldb);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p.d, dt, m, n, key.ldd);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
  for (const auto& [attr, value] : aligns)
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(gemm_->handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  // No algorithm: none found, or (an epilogue or bf16 D, which not every GPU and cuBLASLt has)
  // the heuristic's NOT_SUPPORTED. A plain product's NOT_SUPPORTED is an error, as any other.
  const bool fused = key.epilogue != Epilogue::kNone || key.d_bf16;
  const bool none = (s == CUBLAS_STATUS_SUCCESS && (found < 1 || result.state != CUBLAS_STATUS_SUCCESS)) ||
                    (fused && s == CUBLAS_STATUS_NOT_SUPPORTED);
  if (s != CUBLAS_STATUS_SUCCESS && !none) {
    Gemm::destroy(p);
    fail(Status::Runtime(cublas_text(shape_text(what, {m, n, kk, key.lda, key.ldb, key.ldd}).c_str(), s)));
    return nullptr;
  }
  if (none) {
    Gemm::destroy(p);
    p.key = key;
    p.supported = false;
    if (key.epilogue != Epilogue::kNone) note_no_epilogue(key.epilogue, shape_text(what, {m, n, kk}));
  } else {
    p.algo = result.algo;
  }
  gemm_->plans.push_back(p);
  return &gemm_->plans.back();
}

bool CudaModelOps::run(GemmPlan& plan, const void* A, const void* B, float beta, void* D, const void* bias,
                       const void* aux, const char* what) {
  // The plan's descriptor carries the vector and the aux matrix: set per call, before the call.
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (plan.key.epilogue != Epilogue::kNone)
    s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (s == CUBLAS_STATUS_SUCCESS && has_aux(plan.key.epilogue))
    s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
  const float alpha = 1.f;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmul(gemm_->handle, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, D, plan.d, D, plan.d, &plan.algo,
                       gemm_->workspace, gemm_->workspace_bytes, stream_);
  // An epilogue or bf16 D the heuristic offered and the call refuses (NOT_SUPPORTED: returned at
  // once, nothing queued), as a library that takes the fp32 vector only in D's type may: the
  // plan is marked and the caller runs its own passes. Anything else is an error, named.
  const bool fused = plan.key.epilogue != Epilogue::kNone || plan.key.d_bf16;
  if (fused && s == CUBLAS_STATUS_NOT_SUPPORTED) {
    plan.supported = false;
    if (plan.key.epilogue != Epilogue::kNone)
      note_no_epilogue(plan.key.epilogue, shape_text(what, {plan.key.m, plan.key.n, plan.key.k}), "refused the");
    return false;
  }
  if (s != CUBLAS_STATUS_SUCCESS) fail(Status::Runtime(cublas_text(what, s)));
  return true;
}

// ---- GEMM ops -------------------------------------------------------------------------------------
//
// The model's matrices are row-major; cuBLAS reads memory column-major, where a row-major R x K
// array is its K x R transpose. So every product is computed transposed, Y^T = op(B)^T op(A)^T:
//   out[N,OC] = inp[N,C] W[C,OC]         ->  out^T = W^T inp^T        (m OC, n N, k C)
//   dinp[N,C] += dout[N,OC] W^T          ->  dinp^T = W dout^T        (m C, n N, k OC)
//   dW[C,OC] += inp^T dout               ->  dW^T = dout^T inp        (m OC, n C, k N)
//   logits[N,V] = inp[N,C] wte[V,C]^T    ->  logits^T = wte inp^T     (m V, n N, k C)
//   dinp[N,C] += dlogits[N,V] wte[V,C]   ->  dinp^T = wte^T dlogits^T (m C, n N, k V)
//   dwte[V,C] += dlogits^T inp           ->  dwte^T = inp^T dlogits   (m C, n V, k N)

void CudaModelOps::matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int C,
                                  int OC) {
  const OpScope scope(this, "matmul_forward", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_forward: negative size", {N, C, OC})));
    return;
  }
  if (N == 0 || OC == 0) return;
  // The bias in the product's epilogue; else (no such algorithm, an unaligned bias) it seeds out
  // and the GEMM adds onto it (beta = 1), as the CPU does.
  if (bias && gemm_fused(false, false, OC, N, C, W, OC, inp, C, out, false, Epilogue::kBias, bias, nullptr,
                          "matmul_forward"))
    return;
  if (bias) {
    const int64_t n = int64_t{N} * OC;
    ZOE_LAUNCH(grid_for(n, k::kThreads), k::kThreads, 0, stream_, k::fill_rows_kernel)(out, bias, n, OC);
    if (!check_launch("matmul_forward bias")) return;
  }
  gemm(false, false, OC, N, C, W, OC, inp, C, out, OC, bias ? 1.f : 0.f, "matmul_forward");
}

void CudaModelOps::matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp,
                                   const float* W, int N, int C, int OC, bool overwrite) {
  const OpScope scope(this, "matmul_backward", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_backward: negative size", {N, C, OC})));
    return;
  }
  if (dinp) gemm(true, false, C, N, OC, W, OC, dout, OC, dinp, C, overwrite ? 0.f : 1.f, "matmul_backward dinp");
  if (dW) gemm(false, true, OC, C, N, dout, OC, inp, C, dW, OC, overwrite ? 0.f : 1.f, "matmul_backward dW");
  if (dbias && overwrite) zero(dbias, OC);
  if (dbias) column_reduce(dbias, k::Rows{dout, OC}, N, OC, "matmul_backward dbias");
}

void CudaModelOps::lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) {
  const OpScope scope(this, "lm_head_forward", {{"N", N}, {"C", C}, {"V", V}});
  if (N < 0 || C < 0 || V < 0) {
    fail(Status::Invalid(shape_text("lm_head_forward: negative size", {N, C, V})));
    return;
  }
  gemm(true, false, V, N, C, wte, C, inp, C, logits, V, 0.f, "lm_head_forward");
}

void CudaModelOps::lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                                    const float* wte, int N, int C, int V) {
  const OpScope scope(this, "lm_head_backward", {{"N", N}, {"C", C}, {"V", V}});
  if (N < 0 || C < 0 || V < 0) {
    fail(Status::Invalid(shape_text("lm_head_backward: negative size", {N, C, V})));
    return;
  }
  if (dinp) gemm(false, false, C, N, V, wte, C, dlogits, V, dinp, C, 1.f, "lm_head_backward dinp");
  if (dwte) gemm(false, true, C, V, N, inp, C, dlogits, V, dwte, C, 1.f, "lm_head_backward dwte");
}

// ---- bf16 compute: the same products on bf16 operands (weights in place, a linear layer's input
// bf16 from its producer, the other operands rounded into the caller's scratch first), fp32 out.

void CudaModelOps::round_to_bf16(uint16_t* dst, const float* src, int64_t n, const char* what) {
  if (n <= 0) return;
  ZOE_LAUNCH(grid_for(n, k::kThreads), k::kThreads, 0, stream_, k::round_to_bf16_kernel)(dst, src, n);
  check_launch(what);
}

void CudaModelOps::encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe,
                                        int B, int T, int C) {
  const OpScope scope(this, "encoder_forward_bf16", {{"B", B}, {"T", T}, {"C", C}});
  if (B < 0 || T < 0 || C < 0) {
    fail(Status::Invalid(shape_text("encoder_forward_bf16: negative size", {B, T, C})));
    return;
  }
  const int64_t BT = int64_t{B} * T, n = BT * C;
  if (n == 0) return;
  ZOE_LAUNCH(grid_for(n, k::kThreads), k::kThreads, 0, stream_, k::encoder_forward_kernel<uint16_t>)(
      out, inp, wte, wpe, BT, T, C);
  check_launch("encoder_forward_bf16");
}

void CudaModelOps::matmul_forward_bf16(float* out, const uint16_t* inp, const uint16_t* W, const float* bias, int N,
                                       int C, int OC) {
  const OpScope scope(this, "matmul_forward_bf16", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_forward_bf16: negative size", {N, C, OC})));
    return;
  }
  if (N == 0 || OC == 0) return;
  if (bias && gemm_fused(true, false, OC, N, C, W, OC, inp, C, out, false, Epilogue::kBias, bias, nullptr,
                          "matmul_forward_bf16"))
    return;
  if (bias) {
    const int64_t n = int64_t{N} * OC;
    ZOE_LAUNCH(grid_for(n, k::kThreads), k::kThreads, 0, stream_, k::fill_rows_kernel)(out, bias, n, OC);
    if (!check_launch("matmul_forward_bf16 bias")) return;
  }
  gemm_bf16(false, false, OC, N, C, W, OC, inp, C, out, OC, bias ? 1.f : 0.f, "matmul_forward_bf16");
}

void CudaModelOps::matmul_forward_bf16(uint16_t* out, const uint16_t* inp, const uint16_t* W, const float* bias,
                                       int N, int C, int OC) {
  const OpScope scope(this, "matmul_forward_bf16", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_forward_bf16: negative size", {N, C, OC})));
    return;
  }
  if (N == 0 || OC == 0) return;
  // Rounded by the product's epilogue, the bias with it; else through an fp32 scratch and a pass.
  if (gemm_fused(true, false, OC, N, C, W, OC, inp, C, out, true, bias ? Epilogue::kBias : Epilogue::kNone, bias,
                 nullptr, "matmul_forward_bf16"))
    return;
  auto* f = static_cast<float*>(scratch(sizeof(float) * int64_t{N} * OC));
  if (!f) return;
  matmul_forward_bf16(f, inp, W, bias, N, C, OC);
  round_to_bf16(out, f, int64_t{N} * OC, "matmul_forward_bf16 round out");
}

void CudaModelOps::matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout, const uint16_t* inp,
                                        const uint16_t* W, int N, int C, int OC, uint16_t* scratch,
                                        bool overwrite) {
  const OpScope scope(this, "matmul_backward_bf16", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_backward_bf16: negative size", {N, C, OC})));
    return;
  }
  // dout rounded into scratch, then the bf16-dout op's products (named by this op's scope).
  uint16_t* dout16 = scratch;
  if (dinp || dW) {
    round_to_bf16(dout16, dout, int64_t{N} * OC, "matmul_backward_bf16 round dout");
    matmul_backward_bf16(dinp, dW, static_cast<const uint16_t*>(dout16), inp, W, N, C, OC, overwrite);
  }
  if (dbias && overwrite) zero(dbias, OC);
  if (dbias) column_reduce(dbias, k::Rows{dout, OC}, N, OC, "matmul_backward_bf16 dbias");
}

void CudaModelOps::matmul_backward_bf16(float* dinp, float* dW, const uint16_t* dout, const uint16_t* inp,
                                        const uint16_t* W, int N, int C, int OC, bool overwrite) {
  const OpScope scope(this, "matmul_backward_bf16", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_backward_bf16: negative size", {N, C, OC})));
    return;
  }
  if (dinp)
    gemm_bf16(true, false, C, N, OC, W, OC, dout, OC, dinp, C, overwrite ? 0.f : 1.f, "matmul_backward_bf16 dinp");
  if (dW)
    gemm_bf16(false, true, OC, C, N, dout, OC, inp, C, dW, OC, overwrite ? 0.f : 1.f, "matmul_backward_bf16 dW");
}

// c_fc with GELU in its epilogue (GELU_AUX_BIAS: GELU's input stored rounded into pre on the
// way), else the two ops.
void CudaModelOps::matmul_gelu_forward_bf16(uint16_t* out, uint16_t* pre, const uint16_t* inp, const uint16_t* W,
                                            const float* bias, int N, int C, int OC) {
  const OpScope scope(this, "matmul_gelu_forward_bf16", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_gelu_forward_bf16: negative size", {N, C, OC})));
    return;
  }
  if (N == 0 || OC == 0) return;
  if (bias && gemm_fused(true, false, OC, N, C, W, OC, inp, C, out, true, Epilogue::kGeluAuxBias, bias, pre,
                         "matmul_gelu_forward_bf16"))
    return;
  matmul_forward_bf16(pre, inp, W, bias, N, C, OC);
  gelu_forward_bf16(out, pre, int64_t{N} * OC);
}

// c_proj's dinp with GELU's backward in its epilogue (DGELU_BGRAD: GELU' of pre applied, the bias
// gradient summed before the rounding), else the product into scratch and GELU's backward.
void CudaModelOps::matmul_gelu_backward_bf16(uint16_t* dpre, float* dbias_pre, float* dW, const uint16_t* dout,
                                             const uint16_t* inp, const uint16_t* W, const uint16_t* pre, int N, int C,
                                             int OC, float* scratch) {
  const OpScope scope(this, "matmul_gelu_backward_bf16", {{"N", N}, {"C", C}, {"OC", OC}});
  if (N < 0 || C < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("matmul_gelu_backward_bf16: negative size", {N, C, OC})));
    return;
  }
  matmul_backward_bf16(nullptr, dW, dout, inp, W, N, C, OC, /*overwrite=*/true);
  if (dbias_pre && gemm_fused(true, true, C, N, OC, W, OC, dout, OC, dpre, true, Epilogue::kDGeluBGrad, dbias_pre, pre,
                              "matmul_gelu_backward_bf16 dpre"))
    return;
  matmul_backward_bf16(scratch, nullptr, dout, inp, W, N, C, OC, /*overwrite=*/true);
  gelu_backward_bf16(dpre, dbias_pre, pre, scratch, N, C, /*overwrite=*/true);
}

// The head's logits rounded by the product's epilogue (else from an fp32 product, rows at a time);
// its input and dlogits come in bf16, so nothing is rounded on the way in.
void CudaModelOps::lm_head_forward_bf16(uint16_t* logits, const uint16_t* inp, const uint16_t* wte, int N, int C,
                                        int V) {
  const OpScope scope(this, "lm_head_forward_bf16", {{"N", N}, {"C", C}, {"V", V}});
  if (N < 0 || C < 0 || V < 0) {
    fail(Status::Invalid(shape_text("lm_head_forward_bf16: negative size", {N, C, V})));
    return;
  }
  if (N == 0 || V == 0) return;
  if (gemm_fused(true, true, V, N, C, wte, C, inp, C, logits, true, Epilogue::kNone, nullptr, nullptr,
                 "lm_head_forward_bf16"))
    return;
  // Rows at a time, so that the fp32 scratch stays near head_scratch_floats_ (N*V floats is
  // 1.6 GB for GPT-2 at B8 T1024: the memory the bf16 logits save).
  const int64_t rows = std::max<int64_t>(1, head_scratch_floats_ / std::max(V, 1));
  auto* f = static_cast<float*>(scratch(sizeof(float) * std::min<int64_t>(rows, N) * V));
  if (!f) return;
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min<int64_t>(rows, N - r0);
    gemm_bf16(true, false, V, n, C, wte, C, inp + r0 * C, C, f, V, 0.f, "lm_head_forward_bf16");
    round_to_bf16(logits + r0 * V, f, n * V, "lm_head_forward_bf16 round logits");
  }
}

void CudaModelOps::lm_head_backward_bf16(float* dinp, float* dwte, const uint16_t* dlogits, const uint16_t* inp,
                                         const uint16_t* wte, int N, int C, int V) {
  const OpScope scope(this, "lm_head_backward_bf16", {{"N", N}, {"C", C}, {"V", V}});
  if (N < 0 || C < 0 || V < 0) {
    fail(Status::Invalid(shape_text("lm_head_backward_bf16: negative size", {N, C, V})));
    return;
  }
  if (dinp) gemm_bf16(false, false, C, N, V, wte, C, dlogits, V, dinp, C, 1.f, "lm_head_backward_bf16 dinp");
  if (dwte) gemm_bf16(false, true, C, V, N, inp, C, dlogits, V, dwte, C, 1.f, "lm_head_backward_bf16 dwte");
}

namespace {

// What a column sum's values read, for the emulation's race checks (no-op on CUDA).
template <class T>
void declare_reads(const k::RowsOf<T>& v, int64_t N, int ncols) {
  ZOE_KERNEL_SPAN(v.x, sizeof(T) * ((N - 1) * v.ld + ncols), false);
}
void declare_reads(const k::GeluGrad& v, int64_t N, int ncols) {
  ZOE_KERNEL_SPAN(v.inp, sizeof(uint16_t) * ((N - 1) * v.ld + ncols), false);
  ZOE_KERNEL_SPAN(v.dout, sizeof(float) * ((N - 1) * v.ld + ncols), false);
}
void declare_reads(const k::LnDw& v, int64_t N, int) {
  ZOE_KERNEL_SPAN(v.dout, sizeof(float) * N * v.C, false);
  ZOE_KERNEL_SPAN(v.inp, sizeof(float) * N * v.C, false);
  ZOE_KERNEL_SPAN(v.mean, sizeof(float) * N, false);
  ZOE_KERNEL_SPAN(v.rstd, sizeof(float) * N, false);
}

}  // namespace

// dst[c] += sum over rows r < N of val(r, c), c < ncols: one launch when N fits one chunk,
// else per-chunk partials in the scratch and a second launch that adds them in chunk order.
template <class Val>
void CudaModelOps::column_reduce(float* dst, const Val& val, int64_t N, int ncols, const char* what) {
  if (N <= 0 || ncols <= 0) return;
  int64_t chunk = kColChunkRows;
  while ((N + chunk - 1) / chunk > 65535) chunk *= 2;  // gridDim.y limit
  const int64_t chunks = (N + chunk - 1) / chunk;
  const dim3 grid((ncols + 31) / 32, static_cast<unsigned>(chunks));
  if (chunks == 1) {
    declare_reads(val, N, ncols);
    ZOE_KERNEL_SPAN(dst, sizeof(float) * ncols, true);
    ZOE_LAUNCH(grid, k::kColThreads, 0, stream_, k::column_partial_kernel<Val>)(dst, 1, val, N, ncols, chunk);
    check_launch(what);
    return;
  }
  auto* part = static_cast<float*>(scratch(sizeof(float) * chunks * ncols));
  if (!part) return;
  declare_reads(val, N, ncols);
  ZOE_KERNEL_SPAN(part, sizeof(float) * chunks * ncols, true);
  ZOE_LAUNCH(grid, k::kColThreads, 0, stream_, k::column_partial_kernel<Val>)(part, 0, val, N, ncols, chunk);
  if (!check_launch(what)) return;
  ZOE_LAUNCH(grid_for(ncols, k::kThreads), k::kThreads, 0, stream_, k::column_finish_kernel)(dst, part, chunks,
                                                                                             ncols);
  check_launch(what);
}
// The attention's (cuda_model_ops_attention.cu): c_attn's bias gradient from fp32 or bf16 dqkv.
template void CudaModelOps::column_reduce(float*, const k::Rows&, int64_t, int, const char*);
template void CudaModelOps::column_reduce(float*, const k::RowsOf<uint16_t>&, int64_t, int, const char*);

// ---- memory ---------------------------------------------------------------------------------------

void CudaModelOps::zero(float* x, int64_t n) {
  const OpScope scope(this, "zero", {{"n", n}});
  if (n > 0) check(cudaMemsetAsync(x, 0, sizeof(float) * n, stream_), "zero");
}

void CudaModelOps::copy(float* dst, const float* src, int64_t n) {
  const OpScope scope(this, "copy", {{"n", n}});
  if (n > 0 && dst != src)
    check(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDefault, stream_), "copy");
}

// ---- encoder --------------------------------------------------------------------------------------

void CudaModelOps::encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                                   int C) {
  const OpScope scope(this, "encoder_forward", {{"B", B}, {"T", T}, {"C", C}});
  if (B < 0 || T < 0 || C < 0) {
    fail(Status::Invalid(shape_text("encoder_forward: negative size", {B, T, C})));
    return;
  }
  const int64_t BT = int64_t{B} * T, n = BT * C;
  if (n == 0) return;
  ZOE_LAUNCH(grid_for(n, k::kThreads), k::kThreads, 0, stream_, k::encoder_forward_kernel<float>)(out, inp, wte,
                                                                                                  wpe, BT, T, C);
  check_launch("encoder_forward");
}

void CudaModelOps::encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                                    int C) {
  const OpScope scope(this, "encoder_backward", {{"B", B}, {"T", T}, {"C", C}});
  if (B < 0 || T < 0 || C < 0) {
    fail(Status::Invalid(shape_text("encoder_backward: negative size", {B, T, C})));
    return;
  }
  const int64_t BT = int64_t{B} * T;
  if (BT == 0 || C == 0) return;
  if (BT > INT_MAX) {
    fail(Status::Unsupported(shape_text("encoder_backward: more than 2^31 positions", {B, T, C})));
    return;
  }
  if (dwpe) {
    const int64_t n = int64_t{T} * C;
    ZOE_LAUNCH(grid_for(n, k::kThreads), k::kThreads, 0, stream_, k::encoder_dwpe_kernel)(dwpe, dout, B, T, C);
    if (!check_launch("encoder_backward dwpe")) return;
  }
  if (dwte) {
    auto* links = static_cast<int32_t*>(scratch(2 * sizeof(int32_t) * BT));
    if (!links) return;
    int32_t* next = links;
    int32_t* head = links + BT;
    const unsigned blocks = static_cast<unsigned>((BT + k::kLinkThreads - 1) / k::kLinkThreads);
    ZOE_LAUNCH(blocks, k::kLinkThreads, 0, stream_, k::encoder_links_kernel)(next, head, inp, static_cast<int>(BT));
    if (!check_launch("encoder_backward links")) return;
    ZOE_LAUNCH(static_cast<unsigned>(BT), k::kThreads, 0, stream_, k::encoder_dwte_kernel)(dwte, dout, inp, next,
                                                                                           head, C);
    check_launch("encoder_backward dwte");
  }
}

// ---- layernorm ------------------------------------------------------------------------------------

template <class Out>
void CudaModelOps::layernorm_forward_any(Out* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int N, int C, const char* what) {
  if (N < 0 || C <= 0) {
    if (N != 0) fail(Status::Invalid(shape_text((std::string(what) + ": bad size").c_str(), {N, C})));
    return;
  }
  if (N == 0) return;
  constexpr int rows_per_block = k::kThreads / 32;
  const unsigned blocks = static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
  ZOE_LAUNCH(blocks, k::kThreads, 0, stream_, k::layernorm_forward_kernel<Out>)(out, mean, rstd, inp, w, b, N, C);
  check_launch(what);
}

void CudaModelOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                     const float* b, int N, int C) {
  const OpScope scope(this, "layernorm_forward", {{"N", N}, {"C", C}});
  layernorm_forward_any(out, mean, rstd, inp, w, b, N, C, "layernorm_forward");
}

void CudaModelOps::layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* inp, const float* w,
                                          const float* b, int N, int C) {
  const OpScope scope(this, "layernorm_forward_bf16", {{"N", N}, {"C", C}});
  layernorm_forward_any(out, mean, rstd, inp, w, b, N, C, "layernorm_forward_bf16");
}

void CudaModelOps::layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                      const float* w, const float* mean, const float* rstd, int N, int C) {
  const OpScope scope(this, "layernorm_backward", {{"N", N}, {"C", C}});
  if (N < 0 || C <= 0) {
    if (N != 0) fail(Status::Invalid(shape_text("layernorm_backward: bad size", {N, C})));
    return;
  }
  if (N == 0) return;
  if (dinp) {
    constexpr int rows_per_block = k::kThreads / 32;
    const unsigned blocks = static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
    ZOE_LAUNCH(blocks, k::kThreads, 0, stream_, k::layernorm_dinp_kernel)(dinp, dout, inp, w, mean, rstd, N, C);
    if (!check_launch("layernorm_backward dinp")) return;
  }
  if (dw) column_reduce(dw, k::LnDw{dout, inp, mean, rstd, C}, N, C, "layernorm_backward dw");
  if (db) column_reduce(db, k::Rows{dout, C}, N, C, "layernorm_backward db");
}

// The fp32 kernels (a warp's row sums run in lanes already): dinp seeded with dres, then
// accumulated onto; its rounding and column sums as the other bf16 backwards make theirs.
void CudaModelOps::layernorm_backward_bf16(float* dinp, uint16_t* dinp16, float* dsum, float* dw, float* db,
                                           const float* dres, const float* dout, const float* inp, const float* w,
                                           const float* mean, const float* rstd, int N, int C) {
  const OpScope scope(this, "layernorm_backward_bf16", {{"N", N}, {"C", C}});
  const int64_t n = int64_t{N} * C;
  if (dinp && n > 0 && dres != dinp) {
    const cudaError_t e = dres ? cudaMemcpyAsync(dinp, dres, sizeof(float) * n, cudaMemcpyDefault, stream_)
                               : cudaMemsetAsync(dinp, 0, sizeof(float) * n, stream_);
    if (!check(e, "layernorm_backward_bf16 seed dinp")) return;
  }
  layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  if (!dinp || !dinp16 || !dsum || n <= 0 || !status_.ok()) return;
  round_to_bf16(dinp16, dinp, n, "layernorm_backward_bf16 round dinp");
  zero(dsum, C);
  column_reduce(dsum, k::Rows{dinp, C}, N, C, "layernorm_backward_bf16 dsum");
}

// ---- elementwise ----------------------------------------------------------------------------------

void CudaModelOps::gelu_forward(float* out, const float* inp, int64_t N) {
  const OpScope scope(this, "gelu_forward", {{"N", N}});
  if (N <= 0) return;
  ZOE_LAUNCH(grid_for(N, k::kThreads), k::kThreads, 0, stream_, k::gelu_forward_kernel<float, float>)(out, inp, N);
  check_launch("gelu_forward");
}

void CudaModelOps::gelu_forward_bf16(uint16_t* out, const uint16_t* inp, int64_t N) {
  const OpScope scope(this, "gelu_forward_bf16", {{"N", N}});
  if (N <= 0) return;
  ZOE_LAUNCH(grid_for(N, k::kThreads), k::kThreads, 0, stream_, k::gelu_forward_kernel<uint16_t, uint16_t>)(out, inp,
                                                                                                           N);
  check_launch("gelu_forward_bf16");
}

// The rounded gradient in one pass, c_fc's bias gradient from the same values in column_reduce's.
void CudaModelOps::gelu_backward_bf16(uint16_t* dinp, float* dbias, const uint16_t* inp, const float* dout, int N,
                                      int OC, bool overwrite) {
  const OpScope scope(this, "gelu_backward_bf16", {{"N", N}, {"OC", OC}});
  if (N < 0 || OC < 0) {
    fail(Status::Invalid(shape_text("gelu_backward_bf16: negative size", {N, OC})));
    return;
  }
  const int64_t n = int64_t{N} * OC;
  if (n == 0) {
    if (dbias && overwrite) zero(dbias, OC);  // an empty sum: the bias gradient is still written
    return;
  }
  ZOE_LAUNCH(grid_for(n, k::kThreads), k::kThreads, 0, stream_, k::gelu_backward_bf16_kernel)(dinp, inp, dout, n);
  if (!check_launch("gelu_backward_bf16")) return;
  if (dbias && overwrite) zero(dbias, OC);
  if (dbias) column_reduce(dbias, k::GeluGrad{inp, dout, OC}, N, OC, "gelu_backward_bf16 dbias");
}

void CudaModelOps::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, bool overwrite) {
  const OpScope scope(this, "gelu_backward", {{"N", N}});
  if (N <= 0) return;
  ZOE_LAUNCH(grid_for(N, k::kThreads), k::kThreads, 0, stream_, k::gelu_backward_kernel)(dinp, inp, dout, N, overwrite);
  check_launch("gelu_backward");
}

void CudaModelOps::residual_forward(float* out, const float* inp1, const float* inp2, int64_t N) {
  const OpScope scope(this, "residual_forward", {{"N", N}});
  if (N <= 0) return;
  ZOE_LAUNCH(grid_for(N, k::kThreads), k::kThreads, 0, stream_, k::residual_forward_kernel)(out, inp1, inp2, N);
  check_launch("residual_forward");
}

// ---- cross-entropy --------------------------------------------------------------------------------

template <class L, class D>
void CudaModelOps::crossentropy_any(float* loss, D* dlogits, const L* logits, const int32_t* targets, int N, int V,
                                    float dscale, const char* what) {
  if (N < 0 || (N > 0 && V <= 0)) {
    fail(Status::Invalid(shape_text((std::string(what) + ": bad size").c_str(), {N, V})));
    return;
  }
  double* losses = nullptr;
  if (N > 0) {
    losses = static_cast<double*>(scratch(sizeof(double) * N));
    if (!losses) return;
    ZOE_LAUNCH(static_cast<unsigned>(N), k::kCeThreads, 0, stream_, k::crossentropy_rows_kernel<L, D>)(
        losses, dlogits, logits, targets, V, dscale);
    if (!check_launch(what)) return;
  }
  ZOE_LAUNCH(1, k::kMeanThreads, 0, stream_, k::mean_kernel)(loss, losses, N);
  check_launch("crossentropy mean");
}

void CudaModelOps::crossentropy(float* loss, float* dlogits, const float* logits, const int32_t* targets, int N,
                                int V, float dscale) {
  const OpScope scope(this, "crossentropy", {{"N", N}, {"V", V}});
  crossentropy_any(loss, dlogits, logits, targets, N, V, dscale, "crossentropy");
}

void CudaModelOps::crossentropy_bf16(float* loss, uint16_t* dlogits, const uint16_t* logits, const int32_t* targets,
                                     int N, int V, float dscale) {
  const OpScope scope(this, "crossentropy_bf16", {{"N", N}, {"V", V}});
  crossentropy_any(loss, dlogits, logits, targets, N, V, dscale, "crossentropy_bf16");
}

std::unique_ptr<ModelOps> make_cuda_model_ops(cudaStream_t compute_stream, bool allow_tf32, RawMemory memory) {
  return std::make_unique<CudaModelOps>(compute_stream, allow_tf32, std::move(memory));
}

}  // namespace zoe::gpu

// CudaModelOps against the fp32 CPU reference (host_model_ops()): every op on random inputs at
// small, odd and GPT-2 sizes (B=2, T up to 1024, C=768, NH=12, V=50257), forward outputs and the
// loss within 1e-5 and gradients within 1e-4 of the CPU (error relative to the tensor's largest
// value), null d* outputs skipped, backward outputs accumulated (the increment over a random
// starting value is what is compared), reruns bitwise identical (no order-dependent atomics); and
// one GPT-2 block forward + backward composed of the ops as gpt2_block.cc composes them.
// Skips where there is no CUDA build or no GPU. tools/cuda_emu/run.sh runs the small cases on the
// CPU through an emulation of the kernels (ZOE_CUDA_EMU).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/gpt2_block.h"
#include "ops/model_ops.h"
#include "test_util.h"
#include "zoe/dtype.h"
#include "ops/gpt2_ops.h"

#ifdef ZOE_HAVE_CUDA
#include <cuda_runtime.h>

#include "gpu/cuda_model_ops.h"
#include "gpu/cudnn_attention.h"
#include "gpu/gpu_info.h"

namespace zoe {
#ifdef ZOE_CUDA_EMU
extern "C" unsigned long long cuda_emu_calls(const char* kind);  // tools/cuda_emu/cuda_emu.h
extern "C" void cuda_emu_fail_next(const char* kind);
#endif

namespace {

using Vf = std::vector<float>;
using Vi = std::vector<int32_t>;

// The GPT-2-sized cases: on a GPU always; under the CPU emulation with ZOE_EMU_FULL=1 (the
// cuda_model_ops_full_emu test, about 1.5 minutes with the race check off), less the attention at
// 1024 positions (7 minutes there).
#ifdef ZOE_CUDA_EMU
const bool kFull = std::getenv("ZOE_EMU_FULL") != nullptr;
constexpr bool kEmulated = true;
unsigned long long emu_calls(const char* kind) { return cuda_emu_calls(kind); }
void emu_fail_next(const char* kind) { cuda_emu_fail_next(kind); }
#else
constexpr bool kFull = true;
constexpr bool kEmulated = false;
unsigned long long emu_calls(const char*) { return 0; }
void emu_fail_next(const char*) {}
#endif

constexpr double kFwdTol = 1e-5;  // forward outputs and the loss
constexpr double kBwdTol = 1e-4;  // gradients

Vf rnd(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) { return test::random_floats(n, seed, lo, hi); }
Vi tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  Vi t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint64_t>(V));
  return t;
}

// max |got - want| / max |want|: the error relative to the tensor's scale (as gpt2_ops_test).
// With `base`, the increments got - base and want - base are compared (accumulated outputs).
// A non-finite value in got counts as an infinite error.
double rel_err(const Vf& got, const Vf& want, const Vf* base = nullptr) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); i++) {
    const double b = base ? (*base)[i] : 0.0;
    const double g = double(got[i]) - b, w = double(want[i]) - b;
    if (!std::isfinite(g)) return INFINITY;
    num = std::max(num, std::fabs(g - w));
    den = std::max(den, std::fabs(w));
  }
  return num / den;
}
double max_abs_diff(const Vf& a, const Vf& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN counts as the largest
  }
  return m;
}
bool bitwise_equal(const Vf& a, const Vf& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A device array freed on scope exit. `offset` elements are skipped at the front, so that
// get() is misaligned for the GEMM tests.
template <class T>
class Dev {
 public:
  explicit Dev(size_t n, size_t offset = 0) : n_(n), offset_(offset) {
    if (cudaMalloc(&base_, (n + offset + 1) * sizeof(T)) != cudaSuccess) {
      base_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << n << " elements failed";
    }
  }
  explicit Dev(const std::vector<T>& v, size_t offset = 0) : Dev(v.size(), offset) { upload(v); }
  ~Dev() { cudaFree(base_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;

  T* get() const { return base_ ? static_cast<T*>(base_) + offset_ : nullptr; }
  void upload(const std::vector<T>& v) {
    ASSERT_EQ(v.size(), n_);
    ASSERT_EQ(cudaMemcpy(get(), v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* base_ = nullptr;
  size_t n_, offset_;
};
using DevF = Dev<float>;
using DevH = Dev<uint16_t>;
using DevI = Dev<int32_t>;

class CudaModelOpsTest : public ::testing::Test {
 public:
  void SetUp() override {
    std::string why;
    if (gpu::list_gpus(&why).empty()) GTEST_SKIP() << "no usable GPU, CUDA model ops not tested: " << why;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ops_ = gpu::make_cuda_model_ops(stream_);
    ASSERT_TRUE(status().ok()) << status().message();
  }
  void TearDown() override {
    ops_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status status() const { return static_cast<const gpu::CudaModelOps&>(*ops_).status(); }
  // Waits for the compute stream; every op so far must have succeeded.
  void sync() {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    ASSERT_TRUE(status().ok()) << status().message();
  }
  ModelOps& gpu() { return *ops_; }
  static ModelOps& cpu() { return host_model_ops(); }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<ModelOps> ops_;
};

// ---- memory -------------------------------------------------------------------------------------

TEST_F(CudaModelOpsTest, ZeroAndCopy) {
  const Vf x = rnd(1001, 1);
  DevF a(x), b(x.size());
  gpu().copy(b.get(), a.get(), 1001);
  gpu().zero(a.get() + 1, 999);
  gpu().zero(a.get(), 0);  // empty: nothing happens
  sync();
  EXPECT_TRUE(bitwise_equal(b.download(), x));
  const Vf z = a.download();
  EXPECT_EQ(z[0], x[0]);
  EXPECT_EQ(z[1000], x[1000]);
  for (int i = 1; i < 1000; i++) ASSERT_EQ(z[i], 0.f) << i;
}

// ---- encoder ------------------------------------------------------------------------------------

void check_encoder(CudaModelOpsTest& t, int B, int T, int C, int V, uint64_t seed) {
  SCOPED_TRACE("encoder B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " V=" + std::to_string(V));
  const int64_t BT = int64_t{B} * T;
  const Vi inp = tokens(BT, V, seed);
  const Vf wte = rnd(int64_t{V} * C, seed + 1), wpe = rnd(int64_t{T} * C, seed + 2);
  const Vf dout = rnd(BT * C, seed + 3), dwte0 = rnd(int64_t{V} * C, seed + 4), dwpe0 = rnd(int64_t{T} * C, seed + 5);
  DevI d_inp(inp);
  DevF d_wte(wte), d_wpe(wpe), d_out(BT * C), d_dout(dout), d_dwte(dwte0), d_dwpe(dwpe0);

  Vf out(BT * C);
  t.cpu().encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  t.gpu().encoder_forward(d_out.get(), d_inp.get(), d_wte.get(), d_wpe.get(), B, T, C);
  t.sync();
  EXPECT_LT(rel_err(d_out.download(), out), kFwdTol) << "out";

  Vf dwte = dwte0, dwpe = dwpe0;
  t.cpu().encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
  t.gpu().encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_inp.get(), B, T, C);
  t.sync();
  const Vf g_dwte = d_dwte.download(), g_dwpe = d_dwpe.download();
  EXPECT_LT(rel_err(g_dwte, dwte, &dwte0), kBwdTol) << "dwte";
  EXPECT_LT(rel_err(g_dwpe, dwpe, &dwpe0), kBwdTol) << "dwpe";

  // Deterministic: the same sums again, bit for bit; a null output is left alone.
  d_dwte.upload(dwte0);
  d_dwpe.upload(dwpe0);
  t.gpu().encoder_backward(d_dwte.get(), nullptr, d_dout.get(), d_inp.get(), B, T, C);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dwte.download(), g_dwte)) << "dwte differs on a rerun";
  EXPECT_TRUE(bitwise_equal(d_dwpe.download(), dwpe0)) << "null dwpe was written";
  t.gpu().encoder_backward(nullptr, d_dwpe.get(), d_dout.get(), d_inp.get(), B, T, C);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dwpe.download(), g_dwpe)) << "dwpe differs on a rerun";
}

TEST_F(CudaModelOpsTest, Encoder) {
  check_encoder(*this, 2, 5, 12, 7, 1);
  check_encoder(*this, 3, 37, 20, 3, 2);  // long chains of repeated tokens
  check_encoder(*this, 1, 300, 8, 1000, 3);  // more positions than one link tile
  if (!kFull) return;
  check_encoder(*this, 2, 1024, 768, 50257, 4);
  check_encoder(*this, 2, 1024, 768, 5, 5);  // ~400 positions per token
}

// ---- layernorm ----------------------------------------------------------------------------------

// LayerNorm's output in float64 (two passes, eps 1e-5), rounded once to fp32.
Vf layernorm_ref64(const Vf& inp, const Vf& w, const Vf& b, int N, int C) {
  Vf out(inp.size());
  for (int r = 0; r < N; r++) {
    const float* x = inp.data() + int64_t{r} * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    const double s = 1.0 / std::sqrt(v / C + 1e-5);
    for (int c = 0; c < C; c++) out[int64_t{r} * C + c] = float((x[c] - m) * s * w[c] + b[c]);
  }
  return out;
}

// bf16 bit patterns widened to fp32.
Vf widened(const std::vector<uint16_t>& h) {
  Vf v(h.size());
  for (size_t i = 0; i < h.size(); i++) v[i] = bf16_to_f32(h[i]);
  return v;
}

void check_layernorm(CudaModelOpsTest& t, int N, int C, float offset, uint64_t seed) {
  SCOPED_TRACE("layernorm N=" + std::to_string(N) + " C=" + std::to_string(C));
  Vf inp = rnd(int64_t{N} * C, seed);
  for (float& x : inp) x += offset;  // rows with a large mean
  const Vf w = rnd(C, seed + 1, 0.5f, 1.5f), b = rnd(C, seed + 2);
  DevF d_inp(inp), d_w(w), d_b(b), d_out(inp.size()), d_mean(N), d_rstd(N);
  Vf out(inp.size()), mean(N), rstd(N);
  t.cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  t.gpu().layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), d_b.get(), N, C);
  t.sync();
  // out against float64 arithmetic, not the CPU's: with a large mean, the CPU's sequential fp32
  // sum of a row strays further (3e-5 of the output at offset 30, C 768) than the GPU's tree.
  EXPECT_LT(rel_err(d_out.download(), layernorm_ref64(inp, w, b, N, C)), kFwdTol) << "out";
  EXPECT_LT(rel_err(d_mean.download(), mean), kFwdTol) << "mean";
  EXPECT_LT(rel_err(d_rstd.download(), rstd), kFwdTol) << "rstd";

  // Backward from the CPU's saved statistics, so that only the backward is compared.
  d_mean.upload(mean);
  d_rstd.upload(rstd);
  const Vf dout = rnd(inp.size(), seed + 3), dinp0 = rnd(inp.size(), seed + 4), dw0 = rnd(C, seed + 5),
           db0 = rnd(C, seed + 6);
  DevF d_dout(dout), d_dinp(dinp0), d_dw(dw0), d_db(db0);
  Vf dinp = dinp0, dw = dw0, db = db0;
  t.cpu().layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                             rstd.data(), N, C);
  t.gpu().layernorm_backward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(),
                             d_mean.get(), d_rstd.get(), N, C);
  t.sync();
  const Vf g_dinp = d_dinp.download(), g_dw = d_dw.download(), g_db = d_db.download();
  EXPECT_LT(rel_err(g_dinp, dinp, &dinp0), kBwdTol) << "dinp";
  EXPECT_LT(rel_err(g_dw, dw, &dw0), kBwdTol) << "dw";
  EXPECT_LT(rel_err(g_db, db, &db0), kBwdTol) << "db";

  // Each output on its own, from the same start: bitwise the same as together.
  d_dinp.upload(dinp0);
  d_dw.upload(dw0);
  d_db.upload(db0);
  t.gpu().layernorm_backward(d_dinp.get(), nullptr, nullptr, d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(),
                             d_rstd.get(), N, C);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dinp.download(), g_dinp)) << "dinp alone / rerun";
  EXPECT_TRUE(bitwise_equal(d_dw.download(), dw0)) << "null dw was written";
  t.gpu().layernorm_backward(nullptr, d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(),
                             d_rstd.get(), N, C);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dw.download(), g_dw)) << "dw alone / rerun";
  EXPECT_TRUE(bitwise_equal(d_db.download(), g_db)) << "db alone / rerun";

  // bf16 compute's LayerNorm backward, dres folded in and dinp rounded with its column sums: the
  // CPU's own (row sums in lanes) against the GPU's.
  d_dw.upload(dw0);
  d_db.upload(db0);
  Vf dinp16 = dinp0, dw16 = dw0, db16 = db0, dsum(C);
  std::vector<uint16_t> h16(inp.size());
  DevF d_res(Vf(inp.size(), NAN)), d_dsum(C);
  DevH d_h16(inp.size());
  t.cpu().layernorm_backward_bf16(dinp16.data(), h16.data(), dsum.data(), dw16.data(), db16.data(), dinp0.data(),
                                  dout.data(), inp.data(), w.data(), mean.data(), rstd.data(), N, C);
  d_res.upload(dinp0);  // dres apart from dinp, whose old contents (NaN) are never read
  d_dinp.upload(Vf(inp.size(), NAN));
  t.gpu().layernorm_backward_bf16(d_dinp.get(), d_h16.get(), d_dsum.get(), d_dw.get(), d_db.get(), d_res.get(),
                                  d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(), d_rstd.get(), N, C);
  t.sync();
  EXPECT_LT(rel_err(d_dinp.download(), dinp16, &dinp0), kBwdTol) << "bf16 compute's dinp";
  // Both rounded: one bf16 step apart at most (2^-7 of a value, relative to the tensor's scale).
  EXPECT_LT(rel_err(widened(d_h16.download()), widened(h16)), 1.0 / 128 + kBwdTol) << "bf16 compute's dinp16";
  EXPECT_LT(rel_err(d_dsum.download(), dsum), kBwdTol) << "bf16 compute's dsum";
  EXPECT_LT(rel_err(d_dw.download(), dw16, &dw0), kBwdTol) << "bf16 compute's dw";
  EXPECT_LT(rel_err(d_db.download(), db16, &db0), kBwdTol) << "bf16 compute's db";
}

TEST_F(CudaModelOpsTest, LayerNorm) {
  check_layernorm(*this, 3, 5, 0.f, 10);
  check_layernorm(*this, 7, 33, 10.f, 11);
  check_layernorm(*this, 600, 40, 0.f, 12);  // dw/db over several row chunks
  if (!kFull) return;
  check_layernorm(*this, 2048, 768, 0.f, 13);
  check_layernorm(*this, 2048, 768, 30.f, 14);
}

// ---- matmul -------------------------------------------------------------------------------------

void check_matmul(CudaModelOpsTest& t, int N, int C, int OC, bool with_bias, size_t offset, uint64_t seed) {
  SCOPED_TRACE("matmul N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
               (with_bias ? " bias" : " no bias") + " offset=" + std::to_string(offset));
  const Vf inp = rnd(int64_t{N} * C, seed), W = rnd(int64_t{C} * OC, seed + 1), bias = rnd(OC, seed + 2);
  DevF d_inp(inp, offset), d_W(W, offset), d_bias(bias, offset), d_out(int64_t{N} * OC, offset);
  Vf out(int64_t{N} * OC);
  t.cpu().matmul_forward(out.data(), inp.data(), W.data(), with_bias ? bias.data() : nullptr, N, C, OC);
  t.gpu().matmul_forward(d_out.get(), d_inp.get(), d_W.get(), with_bias ? d_bias.get() : nullptr, N, C, OC);
  t.sync();
  EXPECT_LT(rel_err(d_out.download(), out), kFwdTol) << "out";

  const Vf dout = rnd(out.size(), seed + 3), dinp0 = rnd(inp.size(), seed + 4), dW0 = rnd(W.size(), seed + 5),
           dbias0 = rnd(OC, seed + 6);
  DevF d_dout(dout, offset), d_dinp(dinp0, offset), d_dW(dW0, offset), d_dbias(dbias0, offset);
  Vf dinp = dinp0, dW = dW0, dbias = dbias0;
  t.cpu().matmul_backward(dinp.data(), dW.data(), dbias.data(), dout.data(), inp.data(), W.data(), N, C, OC, false);
  t.gpu().matmul_backward(d_dinp.get(), d_dW.get(), d_dbias.get(), d_dout.get(), d_inp.get(), d_W.get(), N, C, OC,
                          false);
  t.sync();
  const Vf g_dinp = d_dinp.download(), g_dW = d_dW.download(), g_dbias = d_dbias.download();
  EXPECT_LT(rel_err(g_dinp, dinp, &dinp0), kBwdTol) << "dinp";
  EXPECT_LT(rel_err(g_dW, dW, &dW0), kBwdTol) << "dW";
  EXPECT_LT(rel_err(g_dbias, dbias, &dbias0), kBwdTol) << "dbias";

  d_dinp.upload(dinp0);
  d_dW.upload(dW0);
  d_dbias.upload(dbias0);
  t.gpu().matmul_backward(nullptr, d_dW.get(), nullptr, d_dout.get(), d_inp.get(), d_W.get(), N, C, OC, false);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dW.download(), g_dW)) << "dW alone / rerun";
  EXPECT_TRUE(bitwise_equal(d_dinp.download(), dinp0)) << "null dinp was written";
  EXPECT_TRUE(bitwise_equal(d_dbias.download(), dbias0)) << "null dbias was written";
  t.gpu().matmul_backward(d_dinp.get(), nullptr, d_dbias.get(), d_dout.get(), d_inp.get(), d_W.get(), N, C, OC, false);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dinp.download(), g_dinp)) << "dinp alone / rerun";
  EXPECT_TRUE(bitwise_equal(d_dbias.download(), g_dbias)) << "dbias alone / rerun";
}

TEST_F(CudaModelOpsTest, Matmul) {
  check_matmul(*this, 7, 5, 3, true, 0, 20);
  check_matmul(*this, 1, 1, 1, false, 0, 21);
  check_matmul(*this, 33, 17, 65, true, 1, 22);  // odd shapes, pointers 4 bytes off alignment
  check_matmul(*this, 600, 16, 24, true, 3, 23);  // dbias over several row chunks
  if (!kFull) return;
  check_matmul(*this, 128, 768, 2304, true, 0, 24);
  check_matmul(*this, 2048, 768, 3072, true, 0, 25);
  check_matmul(*this, 2048, 3072, 768, true, 0, 26);
  check_matmul(*this, 128, 768, 768, false, 2, 27);
}

// ---- LM head ------------------------------------------------------------------------------------

void check_lm_head(CudaModelOpsTest& t, int N, int C, int V, uint64_t seed) {
  SCOPED_TRACE("lm_head N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V));
  const Vf inp = rnd(int64_t{N} * C, seed), wte = rnd(int64_t{V} * C, seed + 1);
  DevF d_inp(inp), d_wte(wte), d_logits(int64_t{N} * V);
  Vf logits(int64_t{N} * V);
  t.cpu().lm_head_forward(logits.data(), inp.data(), wte.data(), N, C, V);
  t.gpu().lm_head_forward(d_logits.get(), d_inp.get(), d_wte.get(), N, C, V);
  t.sync();
  EXPECT_LT(rel_err(d_logits.download(), logits), kFwdTol) << "logits";

  const Vf dlogits = rnd(logits.size(), seed + 2), dinp0 = rnd(inp.size(), seed + 3),
           dwte0 = rnd(wte.size(), seed + 4);
  DevF d_dlogits(dlogits), d_dinp(dinp0), d_dwte(dwte0);
  Vf dinp = dinp0, dwte = dwte0;
  t.cpu().lm_head_backward(dinp.data(), dwte.data(), dlogits.data(), inp.data(), wte.data(), N, C, V);
  t.gpu().lm_head_backward(d_dinp.get(), d_dwte.get(), d_dlogits.get(), d_inp.get(), d_wte.get(), N, C, V);
  t.sync();
  const Vf g_dinp = d_dinp.download(), g_dwte = d_dwte.download();
  EXPECT_LT(rel_err(g_dinp, dinp, &dinp0), kBwdTol) << "dinp";
  EXPECT_LT(rel_err(g_dwte, dwte, &dwte0), kBwdTol) << "dwte";

  d_dinp.upload(dinp0);
  d_dwte.upload(dwte0);
  t.gpu().lm_head_backward(d_dinp.get(), nullptr, d_dlogits.get(), d_inp.get(), d_wte.get(), N, C, V);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dinp.download(), g_dinp)) << "dinp alone / rerun";
  EXPECT_TRUE(bitwise_equal(d_dwte.download(), dwte0)) << "null dwte was written";
  t.gpu().lm_head_backward(nullptr, d_dwte.get(), d_dlogits.get(), d_inp.get(), d_wte.get(), N, C, V);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dwte.download(), g_dwte)) << "dwte alone / rerun";
}

TEST_F(CudaModelOpsTest, LmHead) {
  check_lm_head(*this, 3, 4, 11, 30);
  check_lm_head(*this, 10, 24, 101, 31);
  if (!kFull) return;
  check_lm_head(*this, 128, 768, 50257, 32);
}

// ---- cross-entropy ------------------------------------------------------------------------------

void check_crossentropy(CudaModelOpsTest& t, int N, int V, float logit_scale, uint64_t seed) {
  SCOPED_TRACE("crossentropy N=" + std::to_string(N) + " V=" + std::to_string(V) +
               " scale=" + std::to_string(logit_scale));
  const Vf logits = rnd(int64_t{N} * V, seed, -logit_scale, logit_scale);
  const Vi targets = tokens(N, V, seed + 1);
  const float dscale = 7.f / static_cast<float>(std::max(N, 1));  // a loss scale over the mean
  float loss = 0.f;
  Vf dlogits = logits;
  t.cpu().crossentropy(&loss, dlogits.data(), dlogits.data(), targets.data(), N, V, dscale);

  DevF d_logits(logits), d_dlogits(logits.size()), d_loss(3);
  DevI d_targets(targets);
  // Forward only: the loss, logits untouched.
  t.gpu().crossentropy(d_loss.get(), nullptr, d_logits.get(), d_targets.get(), N, V, dscale);
  // Into a separate buffer, and in place.
  t.gpu().crossentropy(d_loss.get() + 1, d_dlogits.get(), d_logits.get(), d_targets.get(), N, V, dscale);
  t.sync();
  const Vf g_dlogits = d_dlogits.download();
  EXPECT_TRUE(bitwise_equal(d_logits.download(), logits)) << "forward-only call wrote the logits";
  t.gpu().crossentropy(d_loss.get() + 2, d_logits.get(), d_logits.get(), d_targets.get(), N, V, dscale);
  t.sync();
  const Vf g_loss = d_loss.download();
  EXPECT_LT(rel_err({g_loss[0]}, {loss}), kFwdTol) << "loss " << g_loss[0] << " vs " << loss;
  EXPECT_EQ(g_loss[1], g_loss[0]);
  EXPECT_EQ(g_loss[2], g_loss[0]);
  EXPECT_LT(rel_err(g_dlogits, dlogits), kBwdTol) << "dlogits";
  EXPECT_TRUE(bitwise_equal(d_logits.download(), g_dlogits)) << "in place differs from out of place";
}

TEST_F(CudaModelOpsTest, CrossEntropy) {
  check_crossentropy(*this, 5, 7, 1.f, 40);
  check_crossentropy(*this, 3, 1000, 10.f, 41);
  check_crossentropy(*this, 4, 1, 1.f, 42);  // one class: loss 0, gradient 0
  if (kFull) {
    check_crossentropy(*this, 128, 50257, 1.f, 43);
    check_crossentropy(*this, 128, 50257, 20.f, 44);
  }
  // No positions: the loss is 0 (the CPU's mean of nothing).
  DevF d_loss(Vf{5.f});
  gpu().crossentropy(d_loss.get(), nullptr, nullptr, nullptr, 0, 50257, 1.f);
  sync();
  EXPECT_EQ(d_loss.download()[0], 0.f);
}

// ---- GELU, residual -----------------------------------------------------------------------------

void check_elementwise(CudaModelOpsTest& t, int64_t n, uint64_t seed) {
  SCOPED_TRACE("elementwise n=" + std::to_string(n));
  const Vf x = rnd(n, seed, -6.f, 6.f), y = rnd(n, seed + 1), dout = rnd(n, seed + 2), dinp0 = rnd(n, seed + 3);
  Vf out(n);
  t.cpu().gelu_forward(out.data(), x.data(), n);
  DevF d_x(x), d_out(n);
  t.gpu().gelu_forward(d_out.get(), d_x.get(), n);
  t.sync();
  EXPECT_LT(rel_err(d_out.download(), out), kFwdTol) << "gelu";
  t.gpu().gelu_forward(d_x.get(), d_x.get(), n);  // in place
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_x.download(), d_out.download())) << "gelu in place";

  d_x.upload(x);
  Vf dinp = dinp0;
  t.cpu().gelu_backward(dinp.data(), x.data(), dout.data(), n, false);
  DevF d_dout(dout), d_dinp(dinp0);
  t.gpu().gelu_backward(d_dinp.get(), d_x.get(), d_dout.get(), n, false);
  t.sync();
  EXPECT_LT(rel_err(d_dinp.download(), dinp, &dinp0), kBwdTol) << "gelu backward";
  Vf over(n, NAN);  // overwrite: the old contents (NaN) are never read
  t.cpu().gelu_backward(over.data(), x.data(), dout.data(), n, true);
  DevF d_over(Vf(n, NAN));
  t.gpu().gelu_backward(d_over.get(), d_x.get(), d_dout.get(), n, true);
  t.sync();
  EXPECT_LT(rel_err(d_over.download(), over), kBwdTol) << "gelu backward, overwrite";

  t.cpu().residual_forward(out.data(), x.data(), y.data(), n);
  DevF d_y(y);
  t.gpu().residual_forward(d_out.get(), d_x.get(), d_y.get(), n);
  t.gpu().residual_forward(d_x.get(), d_x.get(), d_y.get(), n);  // out aliases inp1
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_out.download(), out)) << "residual";
  EXPECT_TRUE(bitwise_equal(d_x.download(), out)) << "residual in place";
}

TEST_F(CudaModelOpsTest, GeluAndResidual) {
  check_elementwise(*this, 17, 50);
  check_elementwise(*this, 1000, 51);
  if (kFull) check_elementwise(*this, int64_t{2} * 1024 * 3072 + 5, 52);
}

// ---- attention ----------------------------------------------------------------------------------


// Part 0, 1 or 2 (q, k or v) of a [rows][3C] tensor.
Vf qkv_part(const Vf& qkv, int part, int C) {
  Vf v;
  for (size_t r = 0; r < qkv.size() / (3 * size_t(C)); r++)
    v.insert(v.end(), qkv.begin() + r * 3 * C + part * C, qkv.begin() + r * 3 * C + (part + 1) * C);
  return v;
}

void check_attention(CudaModelOpsTest& t, int B, int T, int C, int NH, float scale, uint64_t seed) {
  SCOPED_TRACE("attention B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " NH=" + std::to_string(NH) + " scale=" + std::to_string(scale));
  const int64_t BT = int64_t{B} * T;
  const Vf qkv = rnd(BT * 3 * C, seed, -scale, scale);
  DevF d_qkv(qkv), d_out(BT * C), d_lse(int64_t{B} * NH * T);
  Vf out(BT * C), lse(int64_t{B} * NH * T);
  t.cpu().attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  t.gpu().attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
  t.sync();
  EXPECT_LT(rel_err(d_out.download(), out), kFwdTol) << "out";
  EXPECT_LT(rel_err(d_lse.download(), lse), kFwdTol) << "lse";

  d_lse.upload(lse);  // backward from the CPU's lse and out: only the backward is compared
  d_out.upload(out);
  const Vf dout = rnd(BT * C, seed + 1), dqkv0 = rnd(qkv.size(), seed + 2);
  DevF d_dout(dout), d_dqkv(dqkv0);
  Vf dqkv = dqkv0;
  t.cpu().attention_backward(dqkv.data(), dout.data(), out.data(), qkv.data(), lse.data(), B, T, C, NH);
  t.gpu().attention_backward(d_dqkv.get(), d_dout.get(), d_out.get(), d_qkv.get(), d_lse.get(), B, T, C, NH);
  t.sync();
  const Vf g_dqkv = d_dqkv.download();
  // q, k and v parts separately: each has its own scale.
  for (int part = 0; part < 3; part++) {
    const Vf b = qkv_part(dqkv0, part, C);
    EXPECT_LT(rel_err(qkv_part(g_dqkv, part, C), qkv_part(dqkv, part, C), &b), kBwdTol) << "d" << "qkv"[part];
  }
  d_dqkv.upload(dqkv0);
  t.gpu().attention_backward(d_dqkv.get(), d_dout.get(), d_out.get(), d_qkv.get(), d_lse.get(), B, T, C, NH);
  t.sync();
  EXPECT_TRUE(bitwise_equal(d_dqkv.download(), g_dqkv)) << "dqkv differs on a rerun";
}

TEST_F(CudaModelOpsTest, Attention) {
  check_attention(*this, 1, 1, 8, 2, 1.f, 60);     // hs 4, one query
  check_attention(*this, 2, 7, 64, 2, 1.f, 61);    // hs 32
  check_attention(*this, 1, 150, 64, 2, 1.f, 70);  // hs 32, 3 tiles of 64
  check_attention(*this, 2, 65, 96, 2, 1.f, 62);   // hs 48 (padded to 64), a tile and one row
  check_attention(*this, 1, 130, 200, 2, 2.f, 63);  // hs 100 (padded to 128), 5 tiles of 32
  check_attention(*this, 1, 64, 64, 1, 3.f, 64);   // hs 64, exactly one tile, peaked softmax
  if (!kFull) return;
  check_attention(*this, 2, 64, 768, 12, 1.f, 65);
  check_attention(*this, 2, 200, 768, 12, 1.f, 66);
  check_attention(*this, 2, 256, 256, 2, 1.f, 69);  // hs 128
  if (kEmulated) return;
  check_attention(*this, 2, 1024, 768, 12, 1.f, 67);
  check_attention(*this, 2, 1024, 768, 12, 3.f, 68);
}

TEST_F(CudaModelOpsTest, AttentionRejectsHeadsAbove128) {
  DevF buf(3 * 2 * 258);
  gpu().attention_forward(buf.get(), buf.get(), buf.get(), 1, 1, 258, 1);
  EXPECT_EQ(status().code(), Code::kUnsupported) << status().message();
  // The error names the op and its sizes; the model asks supports_attention before any step.
  EXPECT_NE(status().message().find("attention_forward(B 1, T 1, C 258, NH 1): "), std::string::npos)
      << status().message();
  EXPECT_EQ(gpu().supports_attention(1, 1, 258, 1).code(), Code::kUnsupported);
  EXPECT_EQ(gpu().supports_attention(65536, 1, 64, 1).code(), Code::kUnsupported);  // B * NH > 65535
  EXPECT_TRUE(gpu().supports_attention(4, 1024, 768, 12).ok());
  static_cast<gpu::CudaModelOps&>(gpu()).clear_status();
  gpu().attention_forward(buf.get(), buf.get(), buf.get(), 1, 1, 258, 4);  // C % NH != 0
  EXPECT_EQ(status().code(), Code::kInvalidInput) << status().message();
  static_cast<gpu::CudaModelOps&>(gpu()).clear_status();
}

// A size no op can run is the ops' status: Invalid (or Unsupported), its message starting with
// the op and its sizes, no launch made; the next op still runs.
TEST_F(CudaModelOpsTest, BadSizesAreErrorsNamingTheOp) {
  auto& ops = static_cast<gpu::CudaModelOps&>(gpu());
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"matmul_forward(N -1", [&] { ops.matmul_forward(nullptr, nullptr, nullptr, nullptr, -1, 4, 4); }},
      {"matmul_backward(N 4, C -1", [&] { ops.matmul_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, -1, 4, false); }},
      {"lm_head_forward(N 4, C 4, V -1", [&] { ops.lm_head_forward(nullptr, nullptr, nullptr, 4, 4, -1); }},
      {"lm_head_backward(N -1", [&] { ops.lm_head_backward(nullptr, nullptr, nullptr, nullptr, nullptr, -1, 4, 4); }},
      {"encoder_forward(B -1", [&] { ops.encoder_forward(nullptr, nullptr, nullptr, nullptr, -1, 4, 4); }},
      {"encoder_forward_bf16(B 1, T -1", [&] { ops.encoder_forward_bf16(nullptr, nullptr, nullptr, nullptr, 1, -1, 4); }},
      {"encoder_backward(B 1, T 1, C -1", [&] { ops.encoder_backward(nullptr, nullptr, nullptr, nullptr, 1, 1, -1); }},
      {"encoder_backward(B 65536, T 65536", [&] { ops.encoder_backward(nullptr, nullptr, nullptr, nullptr, 65536, 65536, 1); }},
      {"matmul_forward_bf16(N -1", [&] { ops.matmul_forward_bf16(static_cast<float*>(nullptr), nullptr, nullptr, nullptr, -1, 4, 4); }},
      {"matmul_forward_bf16(N 4, C 4, OC -1", [&] { ops.matmul_forward_bf16(static_cast<uint16_t*>(nullptr), nullptr, nullptr, nullptr, 4, 4, -1); }},
      {"matmul_backward_bf16(N -1", [&] { ops.matmul_backward_bf16(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, -1, 4, 4, nullptr, false); }},
      {"matmul_backward_bf16(N 4, C -1", [&] { ops.matmul_backward_bf16(nullptr, nullptr, static_cast<const uint16_t*>(nullptr), nullptr, nullptr, 4, -1, 4, false); }},
      {"gelu_backward_bf16(N -1, OC 4", [&] { ops.gelu_backward_bf16(nullptr, nullptr, nullptr, nullptr, -1, 4, false); }},
      {"lm_head_forward_bf16(N -1", [&] { ops.lm_head_forward_bf16(nullptr, nullptr, nullptr, -1, 4, 4); }},
      {"lm_head_backward_bf16(N -1", [&] { ops.lm_head_backward_bf16(nullptr, nullptr, nullptr, nullptr, nullptr, -1, 4, 4); }},
      {"layernorm_forward(N -1", [&] { ops.layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, -1, 4); }},
      {"layernorm_forward_bf16(N 4, C 0", [&] { ops.layernorm_forward_bf16(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0); }},
      {"layernorm_backward(N -1", [&] { ops.layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, -1, 4); }},
      {"attention_backward(B 1, T 1, C 258, NH 1", [&] { ops.attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 258, 1); }},
      {"attention_backward_bf16(B 1, T 1, C 6, NH 4", [&] { ops.attention_backward_bf16(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 6, 4, false); }},
      {"crossentropy(N 4, V 0", [&] { ops.crossentropy(nullptr, nullptr, nullptr, nullptr, 4, 0, 1.f); }},
      {"crossentropy_bf16(N -1, V 4", [&] { ops.crossentropy_bf16(nullptr, nullptr, nullptr, nullptr, -1, 4, 1.f); }},
  };
  for (const auto& [name, call] : calls) {
    call();
    const Status st = status();
    EXPECT_TRUE(st.code() == Code::kInvalidInput || st.code() == Code::kUnsupported) << name << ": " << st.message();
    EXPECT_EQ(st.message().rfind(name, 0), 0u) << name << ": " << st.message();
    ops.clear_status();
  }
  sync();
}

// A product over an empty sum (C 0) writes zeros (cuBLASLt is not asked for a k = 0 product).
TEST_F(CudaModelOpsTest, AnEmptySumWritesZeros) {
  DevF out(Vf(12, 7.f));
  gpu().matmul_forward(out.get(), nullptr, nullptr, nullptr, 3, 0, 4);
  sync();
  EXPECT_EQ(out.download(), Vf(12, 0.f));
}

TEST_F(CudaModelOpsTest, Tf32IsOptIn) {
  // The factory's ops are exact fp32; TF32 is a constructor flag and trades parity for speed.
  EXPECT_FALSE(static_cast<gpu::CudaModelOps&>(gpu()).allow_tf32());
  gpu::CudaModelOps tf32(stream_, /*allow_tf32=*/true);
  ASSERT_TRUE(tf32.status().ok()) << tf32.status().message();
  const int N = 64, C = kFull ? 768 : 32, OC = 48;
  const Vf inp = rnd(int64_t{N} * C, 90), W = rnd(int64_t{C} * OC, 91);
  Vf out(int64_t{N} * OC);
  cpu().matmul_forward(out.data(), inp.data(), W.data(), nullptr, N, C, OC);
  DevF d_inp(inp), d_W(W), d_out(out.size());
  tf32.matmul_forward(d_out.get(), d_inp.get(), d_W.get(), nullptr, N, C, OC);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  ASSERT_TRUE(tf32.status().ok()) << tf32.status().message();
  const double err = rel_err(d_out.download(), out);
  EXPECT_LT(err, 1e-2);  // TF32 keeps 10 mantissa bits
#ifdef ZOE_CUDA_EMU
  // The emulated cuBLASLt rounds the operands to TF32 as the tensor cores do: the result is not
  // the exact fp32 one (about 1e-4 off), so the tolerance above is held to a real difference.
  EXPECT_GT(err, 1e-6) << "TF32 products came out as exact fp32";
#endif
}

// ---- one GPT-2 block ----------------------------------------------------------------------------

using gpt2::BlockActs;
using gpt2::BlockDims;
using gpt2::BlockTensors;

// GPT-2-like parameters: layernorm weights near 1, small biases, matrices at about init scale.
Vf block_params(int C, uint64_t seed) {
  Vf flat(gpt2::block_numel(C));
  const auto t = gpt2::block_tensors<float*>(flat.data(), C);
  auto fill = [&](float* p, int64_t n, float lo, float hi, uint64_t s) {
    const Vf v = rnd(n, s, lo, hi);
    std::copy(v.begin(), v.end(), p);
  };
  const int64_t c = C;
  fill(t.ln1_w, c, 0.8f, 1.2f, seed);
  fill(t.ln1_b, c, -0.05f, 0.05f, seed + 1);
  fill(t.qkv_w, c * 3 * c, -0.06f, 0.06f, seed + 2);
  fill(t.qkv_b, 3 * c, -0.02f, 0.02f, seed + 3);
  fill(t.attproj_w, c * c, -0.04f, 0.04f, seed + 4);
  fill(t.attproj_b, c, -0.02f, 0.02f, seed + 5);
  fill(t.ln2_w, c, 0.8f, 1.2f, seed + 6);
  fill(t.ln2_b, c, -0.05f, 0.05f, seed + 7);
  fill(t.fc_w, c * 4 * c, -0.04f, 0.04f, seed + 8);
  fill(t.fc_b, 4 * c, -0.02f, 0.02f, seed + 9);
  fill(t.fcproj_w, 4 * c * c, -0.02f, 0.02f, seed + 10);
  fill(t.fcproj_b, c, -0.02f, 0.02f, seed + 11);
  return flat;
}

void check_block(CudaModelOpsTest& t, const BlockDims& d, uint64_t seed) {
  SCOPED_TRACE("block B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) + " C=" + std::to_string(d.C) +
               " NH=" + std::to_string(d.NH));
  const int64_t BTC = int64_t{d.B} * d.T * d.C;
  const Vf params = block_params(d.C, seed), inp = rnd(BTC, seed + 20), dout = rnd(BTC, seed + 21);
  const int64_t np = gpt2::block_numel(d.C), na = gpt2::block_acts_numel(d), ns = gpt2::block_scratch_numel(d);

  // The same block (gpt2_block.cc) on the CPU reference ops and on the GPU's.
  gpt2::BlockBuffers bb(d);
  Vf out(BTC), dinp(BTC), dparams(np, 0.f);
  gpt2::block_forward(t.cpu(), out.data(), bb.acts, params.data(), inp.data(), d);
  gpt2::block_backward(t.cpu(), dinp.data(), dparams.data(), dout.data(), bb.acts, params.data(), inp.data(), d,
                       bb.scratch.data(), /*recompute=*/false);
  DevF d_params(params), d_inp(inp), d_dout(dout), d_acts(na), d_scratch(ns), d_out(BTC), d_dinp(BTC),
      d_dparams(Vf(np, 0.f));
  const BlockActs g_acts = gpt2::block_acts_bind(d_acts.get(), d);
  gpt2::block_forward(t.gpu(), d_out.get(), g_acts, d_params.get(), d_inp.get(), d);
  gpt2::block_backward(t.gpu(), d_dinp.get(), d_dparams.get(), d_dout.get(), g_acts, d_params.get(), d_inp.get(), d,
                       d_scratch.get(), /*recompute=*/false);
  t.sync();
  EXPECT_LT(rel_err(d_out.download(), out), kFwdTol) << "block out";
  EXPECT_LT(rel_err(d_dinp.download(), dinp), kBwdTol) << "block dinp";
  // Each parameter's gradient on its own scale.
  const Vf g_dparams = d_dparams.download();
  const auto want = gpt2::block_tensors<const float*>(dparams.data(), d.C);
  const auto got = gpt2::block_tensors<const float*>(g_dparams.data(), d.C);
  const char* names[] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attproj_w", "attproj_b",
                         "ln2_w", "ln2_b", "fc_w",  "fc_b",  "fcproj_w",  "fcproj_b"};
  auto list = [](const BlockTensors<const float*>& b) {
    return std::array<const float*, 12>{b.ln1_w, b.ln1_b, b.qkv_w,     b.qkv_b,    b.attproj_w, b.attproj_b,
                                        b.ln2_w, b.ln2_b, b.fc_w,      b.fc_b,     b.fcproj_w,  b.fcproj_b};
  };
  const auto w_ptrs = list(want), g_ptrs = list(got);
  for (int i = 0; i < 12; i++) {
    const int64_t n = (i + 1 < 12 ? w_ptrs[i + 1] : dparams.data() + np) - w_ptrs[i];
    const Vf w(w_ptrs[i], w_ptrs[i] + n), g(g_ptrs[i], g_ptrs[i] + n);
    EXPECT_LT(rel_err(g, w), kBwdTol) << "d" << names[i];
  }
}

TEST_F(CudaModelOpsTest, Gpt2BlockForwardBackward) {
  check_block(*this, {1, 9, 32, 2}, 70);
  check_block(*this, {2, 40, 48, 3}, 71);
  if (!kFull) return;
  check_block(*this, {2, 64, 768, 12}, 72);
  check_block(*this, {2, 256, 768, 12}, 73);
}

// ---- bf16 compute ---------------------------------------------------------------------------------
// The bf16 ops against the CPU's bf16 ops (the same rounded operands, fp32 accumulation in another
// order): within the fp32 tolerances; the encoder bitwise.


std::vector<uint16_t> bf16_weights(size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
  const Vf v = rnd(n, seed, -0.5f, 0.5f);
  for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(v[i]);
  return h;
}

void check_bf16_linear(CudaModelOpsTest& t, int N, int C, int OC, uint64_t seed) {
  SCOPED_TRACE("matmul_bf16 N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
  const Vf inp = rnd(int64_t{N} * C, seed), dout = rnd(int64_t{N} * OC, seed + 1), bias = rnd(OC, seed + 2);
  const auto W = bf16_weights(int64_t{C} * OC, seed + 3);
  const Vf dinp0 = rnd(inp.size(), seed + 4), dW0 = rnd(W.size(), seed + 5), db0 = rnd(OC, seed + 6);
  std::vector<uint16_t> scratch(int64_t{N} * OC), inp16(inp.size());
  gpt2::round_to_bf16(inp16.data(), inp.data(), int64_t(inp.size()));  // a linear layer's input is bf16
  DevF d_inp(inp), d_dout(dout), d_bias(bias), d_out(int64_t{N} * OC), d_dinp(dinp0), d_dW(dW0), d_db(db0);
  DevH d_W(W), d_scratch(scratch.size()), d_inp16(inp16);
  Vf out(int64_t{N} * OC), dinp = dinp0, dW = dW0, db = db0;
  {
    t.cpu().matmul_forward_bf16(out.data(), inp16.data(), W.data(), bias.data(), N, C, OC);
    t.gpu().matmul_forward_bf16(d_out.get(), d_inp16.get(), d_W.get(), d_bias.get(), N, C, OC);
    // The bf16 output (c_attn's): the fp32 one rounded, so within one bf16 rounding of the CPU's.
    std::vector<uint16_t> out16(int64_t{N} * OC);
    DevH d_out16(out16.size());
    t.cpu().matmul_forward_bf16(out16.data(), inp16.data(), W.data(), bias.data(), N, C, OC);
    t.gpu().matmul_forward_bf16(d_out16.get(), d_inp16.get(), d_W.get(), d_bias.get(), N, C, OC);
    t.sync();
    // The GPU's own fp32 product rounded, to one bf16 step (the epilogue rounds a product of its
    // own, whose algorithm may add in another order); against the CPU's, one bf16 rounding and the
    // fp32 tolerance, relative to the tensor's scale (an element near 0 that sums cancel to may
    // differ in many bf16 steps: the two GEMMs add in different orders).
    const std::vector<uint16_t> got16 = d_out16.download();
    const Vf gpu_out = d_out.download();
    for (size_t i = 0; i < got16.size(); i++)
      ASSERT_LE(std::abs(int(got16[i]) - int(f32_to_bf16(gpu_out[i]))), 1) << "out16 " << i;
    Vf got_w(got16.size()), want_w(out16.size());
    for (size_t i = 0; i < got16.size(); i++) got_w[i] = bf16_to_f32(got16[i]), want_w[i] = bf16_to_f32(out16[i]);
    EXPECT_LT(rel_err(got_w, want_w), 1.0 / 256 + kFwdTol) << "out16 against the CPU's";
    t.cpu().matmul_backward_bf16(dinp.data(), dW.data(), db.data(), dout.data(), inp16.data(), W.data(), N, C, OC,
                                 scratch.data(), false);
    t.gpu().matmul_backward_bf16(d_dinp.get(), d_dW.get(), d_db.get(), d_dout.get(), d_inp16.get(), d_W.get(), N, C,
                                 OC, d_scratch.get(), false);
    Vf over(inp.size(), NAN);  // overwrite: the old dinp (NaN) is never read
    t.cpu().matmul_backward_bf16(over.data(), nullptr, nullptr, dout.data(), inp16.data(), W.data(), N, C, OC,
                                 scratch.data(), true);
    DevF d_over(Vf(inp.size(), NAN));
    t.gpu().matmul_backward_bf16(d_over.get(), nullptr, nullptr, d_dout.get(), d_inp16.get(), d_W.get(), N, C, OC,
                                 d_scratch.get(), true);
    t.sync();
    EXPECT_LT(rel_err(d_over.download(), over), kBwdTol) << "dinp, overwrite";
  }
  t.sync();
  EXPECT_LT(rel_err(d_out.download(), out), kFwdTol) << "out";
  EXPECT_LT(rel_err(d_dinp.download(), dinp, &dinp0), kBwdTol) << "dinp";
  EXPECT_LT(rel_err(d_dW.download(), dW, &dW0), kBwdTol) << "dW";
  EXPECT_LT(rel_err(d_db.download(), db, &db0), kBwdTol) << "dbias";
}

// bf16 values compared as widened, relative to the tensor's scale: one bf16 rounding apart (each
// side rounds a sum of its own order) and the fp32 tolerance.
double rel_err16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  Vf g(got.size()), w(want.size());
  for (size_t i = 0; i < got.size(); i++) g[i] = bf16_to_f32(got[i]);
  for (size_t i = 0; i < want.size(); i++) w[i] = bf16_to_f32(want[i]);
  return rel_err(g, w);
}
constexpr double kOneBf16Rounding = 1.0 / 256;

// The bf16 LM head and its loss, no fp32 logits: the logits rounded by the product, the loss on
// them widened, dlogits rounded, read as they are by the backward. The loss runs on the CPU's
// logits on both sides, so it is held to the CPU's closely.
void check_bf16_lm_head(CudaModelOpsTest& t, int N, int C, int V, uint64_t seed) {
  SCOPED_TRACE("lm_head_bf16 N=" + std::to_string(N) + " C=" + std::to_string(C) + " V=" + std::to_string(V));
  const auto inp16 = bf16_weights(int64_t{N} * C, seed), W = bf16_weights(int64_t{V} * C, seed + 1);
  const Vf dinp0 = rnd(inp16.size(), seed + 2), dW0 = rnd(W.size(), seed + 3);
  const Vi targets = tokens(N, V, seed + 4);
  const float dscale = 5.f / static_cast<float>(N);
  std::vector<uint16_t> logits(int64_t{N} * V), dlogits(logits.size());
  float loss = 0.f;
  t.cpu().lm_head_forward_bf16(logits.data(), inp16.data(), W.data(), N, C, V);
  t.cpu().crossentropy_bf16(&loss, dlogits.data(), logits.data(), targets.data(), N, V, dscale);
  DevH d_inp(inp16), d_W(W), d_logits(logits.size()), d_cpu_logits(logits), d_dlogits(logits.size());
  DevH d_in_place(logits), d_cpu_dlogits(dlogits);
  DevF d_loss(3), d_dinp(dinp0), d_dW(dW0);
  DevI d_targets(targets);
  t.gpu().lm_head_forward_bf16(d_logits.get(), d_inp.get(), d_W.get(), N, C, V);
  t.gpu().crossentropy_bf16(d_loss.get(), nullptr, d_cpu_logits.get(), d_targets.get(), N, V, dscale);
  t.gpu().crossentropy_bf16(d_loss.get() + 1, d_dlogits.get(), d_cpu_logits.get(), d_targets.get(), N, V, dscale);
  t.gpu().crossentropy_bf16(d_loss.get() + 2, d_in_place.get(), d_in_place.get(), d_targets.get(), N, V, dscale);
  // The backward on the CPU's dlogits on both sides.
  Vf dinp = dinp0, dW = dW0;
  t.cpu().lm_head_backward_bf16(dinp.data(), dW.data(), dlogits.data(), inp16.data(), W.data(), N, C, V);
  t.gpu().lm_head_backward_bf16(d_dinp.get(), d_dW.get(), d_cpu_dlogits.get(), d_inp.get(), d_W.get(), N, C, V);
  t.sync();
  EXPECT_LT(rel_err16(d_logits.download(), logits), kOneBf16Rounding + kFwdTol) << "logits";
  const Vf g_loss = d_loss.download();
  EXPECT_LT(rel_err({g_loss[0]}, {loss}), kFwdTol) << "loss " << g_loss[0] << " vs " << loss;
  EXPECT_EQ(g_loss[1], g_loss[0]);
  EXPECT_EQ(g_loss[2], g_loss[0]);
  EXPECT_TRUE(d_cpu_logits.download() == logits) << "forward-only call wrote the logits";
  const std::vector<uint16_t> g_dlogits = d_dlogits.download();
  EXPECT_LT(rel_err16(g_dlogits, dlogits), kOneBf16Rounding + kBwdTol) << "dlogits";
  EXPECT_TRUE(d_in_place.download() == g_dlogits) << "in place differs from out of place";
  EXPECT_LT(rel_err(d_dinp.download(), dinp, &dinp0), kBwdTol) << "dinp";
  EXPECT_LT(rel_err(d_dW.download(), dW, &dW0), kBwdTol) << "dW";
}

// A bf16 output with its bias comes out of the product's epilogue: no fp32 scratch, no pass. An
// unaligned bias (cuBLASLt's epilogue reads it 16 bytes at a time) takes the scratch and the
// rounding pass instead; both within one bf16 rounding (and fp32's tolerance) of the CPU's.
TEST_F(CudaModelOpsTest, Bf16OutputIsRoundedInTheProductsEpilogue) {
  const int N = 33, C = 16, OC = 64;
  const auto W = bf16_weights(int64_t{C} * OC, 97), inp16 = bf16_weights(int64_t{N} * C, 98);
  const Vf bias = rnd(OC, 99);
  std::vector<uint16_t> want(int64_t{N} * OC);
  cpu().matmul_forward_bf16(want.data(), inp16.data(), W.data(), bias.data(), N, C, OC);
  auto& ops = static_cast<gpu::CudaModelOps&>(gpu());
  DevH d_W(W), d_inp(inp16);
  for (size_t offset : {0, 1}) {
    SCOPED_TRACE("bias offset " + std::to_string(offset));
    DevF d_bias(bias, offset);
    DevH d_out(want.size());
    const size_t held = ops.workspace_bytes();
    ops.matmul_forward_bf16(d_out.get(), d_inp.get(), d_W.get(), d_bias.get(), N, C, OC);
    sync();
    if (offset == 0) EXPECT_EQ(ops.workspace_bytes(), held) << "the epilogue path took scratch";
    else EXPECT_GT(ops.workspace_bytes(), held) << "an unaligned bias went to the epilogue";
    const std::vector<uint16_t> got = d_out.download();
    Vf got_w(got.size()), want_w(want.size());
    for (size_t i = 0; i < got.size(); i++) got_w[i] = bf16_to_f32(got[i]), want_w[i] = bf16_to_f32(want[i]);
    EXPECT_LT(rel_err(got_w, want_w), 1.0 / 256 + kFwdTol);
  }
}

TEST_F(CudaModelOpsTest, Bf16Products) {
  check_bf16_linear(*this, 7, 5, 3, 90);
  check_bf16_linear(*this, 33, 16, 64, 91);
  if (!kFull) return;
  check_bf16_linear(*this, 1024, 768, 3072, 93);
}

// Where cuBLASLt has no algorithm that rounds the head's logits (the emulation's heuristic is
// made to fail once), they are rounded from an fp32 product made rows at a time through a
// bounded scratch, not N*V floats: the same logits, here in four products of 30, 30, 30, 10 rows.
TEST_F(CudaModelOpsTest, Bf16LmHeadWithoutTheEpilogueRoundsRowsAtATime) {
  if (!kEmulated) GTEST_SKIP() << "the emulation's fault injection takes this path";
  const int N = 100, C = 8, V = 1000;
  auto& ops = static_cast<gpu::CudaModelOps&>(gpu());
  ops.set_head_scratch_floats(30 * V);
  const auto inp16 = bf16_weights(int64_t{N} * C, 130), W = bf16_weights(int64_t{V} * C, 131);
  std::vector<uint16_t> want(int64_t{N} * V);
  cpu().lm_head_forward_bf16(want.data(), inp16.data(), W.data(), N, C, V);
  DevH d_inp(inp16), d_W(W), d_logits(want.size());
  const unsigned long long products = emu_calls("cublasLtMatmul");
  emu_fail_next("cublasLtMatmulAlgoGetHeuristic");
  ops.lm_head_forward_bf16(d_logits.get(), d_inp.get(), d_W.get(), N, C, V);
  sync();
  ASSERT_TRUE(status().ok()) << status().message();
  EXPECT_EQ(emu_calls("cublasLtMatmul") - products, 4u);
  EXPECT_LT(rel_err(widened(d_logits.download()), widened(want)), 1.0 / 128 + kFwdTol);
}

TEST_F(CudaModelOpsTest, Bf16LmHeadAndLoss) {
  check_bf16_lm_head(*this, 10, 24, 101, 92);
  check_bf16_lm_head(*this, 4, 1, 1, 95);  // one class: loss 0, gradient 0
  if (!kFull) return;
  check_bf16_lm_head(*this, 1024, 768, 50257, 94);
}

// The producers of the linear layers' bf16 inputs: the fp32 op's output rounded to bf16 as it is
// stored, so against the CPU's fp32 op within one bf16 rounding (2^-8 relative, and the fp32
// tolerance); the CPU's own bf16 producers are checked bitwise in gpt2_bf16_test.
TEST_F(CudaModelOpsTest, Bf16ProducersRoundTheFp32Output) {
  constexpr double kOneRounding = 1.0 / 256 + kFwdTol;
  const int B = 2, T = 40, C = 48, NH = 3, N = B * T;
  const int64_t NC = int64_t{N} * C;
  const Vf x = rnd(NC, 100), w = rnd(C, 101, 0.8f, 1.2f), b = rnd(C, 102, -0.1f, 0.1f);
  // GELU reads c_fc's output as its product rounded it.
  std::vector<uint16_t> g16(4 * NC);
  gpt2::round_to_bf16(g16.data(), rnd(4 * NC, 103, -4.f, 4.f).data(), 4 * NC);
  const Vf g = widened(g16);
  // qkv comes in bf16 (c_attn's product writes it so): the reference is the fp32 attention on
  // the same values widened, forward and backward.
  std::vector<uint16_t> qkv16(3 * NC);
  gpt2::round_to_bf16(qkv16.data(), rnd(3 * NC, 104).data(), 3 * NC);
  Vf qkv(3 * NC);
  for (int64_t i = 0; i < 3 * NC; i++) qkv[i] = bf16_to_f32(qkv16[i]);
  const Vf dout = rnd(NC, 105);
  Vf ln(NC), mean(N), rstd(N), gelu(4 * NC), att(NC), lse(int64_t{B} * NH * T), dqkv(3 * NC, 0.f);
  cpu().layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  cpu().gelu_forward(gelu.data(), g.data(), 4 * NC);
  cpu().attention_forward(att.data(), lse.data(), qkv.data(), B, T, C, NH);
  cpu().attention_backward(dqkv.data(), dout.data(), att.data(), qkv.data(), lse.data(), B, T, C, NH);
  DevF d_x(x), d_w(w), d_b(b), d_mean(N), d_rstd(N), d_lse(lse.size()), d_dout(dout), d_dbias(3 * C);
  DevH d_ln(NC), d_g(g16), d_gelu(4 * NC), d_att(NC), d_qkv(qkv16), d_dqkv(3 * NC);
  gpu().layernorm_forward_bf16(d_ln.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(), d_b.get(), N, C);
  gpu().gelu_forward_bf16(d_gelu.get(), d_g.get(), 4 * NC);
  // The fp32 kernels on widened tiles (Bf16AttentionOnTensorCores holds the default path).
  static_cast<gpu::CudaModelOps&>(gpu()).set_attention_kernels(gpu::CudaModelOps::AttentionKernels::kFp32);
  gpu().attention_forward_bf16(d_att.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
  gpu().attention_backward_bf16(d_dqkv.get(), d_dbias.get(), d_dout.get(), d_att.get(), d_qkv.get(), d_lse.get(), B,
                                T, C, NH, /*overwrite=*/true);
  sync();
  EXPECT_LT(rel_err(widened(d_ln.download()), ln), kOneRounding) << "layernorm";
  EXPECT_LT(rel_err(d_mean.download(), mean), kFwdTol) << "layernorm mean";
  EXPECT_LT(rel_err(widened(d_gelu.download()), gelu), kOneRounding) << "gelu";
  EXPECT_LT(rel_err(widened(d_att.download()), att), kOneRounding) << "attention";
  EXPECT_LT(rel_err(d_lse.download(), lse), kFwdTol) << "attention lse";
  // The backward's row term D = dout . out comes from the output as the bf16 forward stored it
  // (as FlashAttention's does): within one bf16 rounding of the fp32 attention, not fp32's
  // tolerance, and dqkv is stored rounded (one more).
  EXPECT_LT(rel_err(widened(d_dqkv.download()), dqkv), 2 * kOneRounding) << "attention dqkv (rounded)";
  // c_attn's bias gradient: the column sums of the unrounded dqkv.
  Vf sums(3 * C, 0.f);
  for (int64_t r = 0; r < N; r++)
    for (int c = 0; c < 3 * C; c++) sums[c] += dqkv[r * 3 * C + c];
  EXPECT_LT(rel_err(d_dbias.download(), sums), kOneRounding) << "attention dbias";
}

// GELU's bf16 backward against the CPU's: the gradient within one bf16 step of it, relative
// to the tensor's scale (the two tanh differ in their last bits, which may move a rounding, and
// near GELU's minimum, where the gradient crosses 0, by many bf16 steps of a tiny value), c_fc's
// dbias within the gradients' tolerance, accumulated and overwritten; then c_fc's products on that
// rounded gradient (the overload without a rounding pass) against the CPU's. N: more than one
// 256-row chunk of the column sums.
TEST_F(CudaModelOpsTest, GeluBackwardBf16AndTheProductsOnItsRoundedGradient) {
  const int N = 300, C = 40, OC = 4 * C;
  const int64_t n = int64_t{N} * OC;
  std::vector<uint16_t> x16(n), inp16(int64_t{N} * C), W(int64_t{C} * OC);
  gpt2::round_to_bf16(x16.data(), rnd(n, 110, -5.f, 5.f).data(), n);
  gpt2::round_to_bf16(inp16.data(), rnd(inp16.size(), 111).data(), int64_t(inp16.size()));
  gpt2::round_to_bf16(W.data(), rnd(W.size(), 112, -0.5f, 0.5f).data(), int64_t(W.size()));
  const Vf dout = rnd(n, 113), db0 = rnd(OC, 114), dinp0 = rnd(inp16.size(), 115), dW0 = rnd(W.size(), 116);
  std::vector<uint16_t> d16(n);
  Vf db = db0;
  cpu().gelu_backward_bf16(d16.data(), db.data(), x16.data(), dout.data(), N, OC);
  DevH d_x16(x16), d_d16(n), d_inp16(inp16), d_W(W);
  DevF d_dout(dout), d_db(db0), d_over(Vf(OC, NAN));
  gpu().gelu_backward_bf16(d_d16.get(), d_db.get(), d_x16.get(), d_dout.get(), N, OC);
  gpu().gelu_backward_bf16(d_d16.get(), d_over.get(), d_x16.get(), d_dout.get(), N, OC, /*overwrite=*/true);
  sync();
  EXPECT_LT(rel_err(widened(d_d16.download()), widened(d16)), 1.0 / 128 + kBwdTol) << "dinp";
  EXPECT_LT(rel_err(d_db.download(), db, &db0), kBwdTol) << "dbias";
  Vf over(OC);
  for (int o = 0; o < OC; o++) over[o] = db[o] - db0[o];
  EXPECT_LT(rel_err(d_over.download(), over), kBwdTol) << "dbias, overwrite";

  Vf dinp = dinp0, dW = dW0;
  cpu().matmul_backward_bf16(dinp.data(), dW.data(), d16.data(), inp16.data(), W.data(), N, C, OC);
  DevF d_dinp(dinp0), d_dW(dW0);
  d_d16.upload(d16);  // the CPU's rounding: the products alone are compared
  gpu().matmul_backward_bf16(d_dinp.get(), d_dW.get(), d_d16.get(), d_inp16.get(), d_W.get(), N, C, OC);
  sync();
  EXPECT_LT(rel_err(d_dinp.download(), dinp, &dinp0), kBwdTol) << "dinp";
  EXPECT_LT(rel_err(d_dW.download(), dW, &dW0), kBwdTol) << "dW";
}

// c_fc with its GELU, and c_proj's backward with GELU's, against the CPU's two ops each: in
// cuBLASLt's GELU_AUX_BIAS / DGELU_BGRAD epilogues where the rows (the aux matrix's leading
// dimension) are a multiple of 8 (no kernel of zoe's runs then: the emulation counts launches),
// else in the separate passes. GELU's input within a bf16 step of the CPU's; GELU's output within
// two (the epilogue applies it before its input's rounding); the gradients, dW and the bias
// gradient (written: their NaN starts never read) within the tolerances of the ops they fuse.
void check_gelu_fusion(CudaModelOpsTest& t, int N, int C, int OC, bool fused, uint64_t seed) {
  SCOPED_TRACE("gelu fusion N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
  const auto inp16 = bf16_weights(int64_t{N} * C, seed), W = bf16_weights(int64_t{C} * OC, seed + 1);
  const Vf bias = rnd(OC, seed + 2);
  std::vector<uint16_t> out(int64_t{N} * OC), pre(out.size());
  t.cpu().matmul_gelu_forward_bf16(out.data(), pre.data(), inp16.data(), W.data(), bias.data(), N, C, OC);
  DevH d_inp(inp16), d_W(W), d_out(out.size()), d_pre(pre.size()), d_out0(out.size()), d_pre0(pre.size());
  DevF d_bias(bias), d_bias0(rnd(OC, seed + 5));
  auto launches = [] { return kEmulated ? emu_calls("launch") : 0; };
  // A first call with other buffers and another bias: each call's own aux matrix and bias are
  // the ones used (a plan made at the first call keeps its pointers unless each call sets them).
  t.gpu().matmul_gelu_forward_bf16(d_out0.get(), d_pre0.get(), d_inp.get(), d_W.get(), d_bias0.get(), N, C, OC);
  const auto before = launches();
  t.gpu().matmul_gelu_forward_bf16(d_out.get(), d_pre.get(), d_inp.get(), d_W.get(), d_bias.get(), N, C, OC);
  t.sync();
  if (kEmulated) {
    EXPECT_EQ(launches() == before, fused) << "forward: kernels of zoe's ran (or none)";
  }
  EXPECT_LT(rel_err(widened(d_pre.download()), widened(pre)), 1.0 / 128 + kFwdTol) << "pre";
  EXPECT_LT(rel_err(widened(d_out.download()), widened(out)), 2.0 / 128 + kFwdTol) << "out";

  // The backward of a product [N,OC] -> [N,C2] whose input is GELU(pre), pre [N,OC] the CPU's.
  const int C2 = C;
  const auto dout = bf16_weights(int64_t{N} * C2, seed + 3), W2 = bf16_weights(int64_t{OC} * C2, seed + 4);
  std::vector<uint16_t> dpre(pre.size());
  Vf dbias(OC), dW(W2.size()), scratch(pre.size());
  t.cpu().matmul_gelu_backward_bf16(dpre.data(), dbias.data(), dW.data(), dout.data(), out.data(), W2.data(),
                                    pre.data(), N, OC, C2, scratch.data());
  DevH d_dout(dout), d_W2(W2), d_gelu(out), d_cpu_pre(pre), d_dpre(dpre.size()), d_dpre0(dpre.size());
  DevF d_dbias(Vf(OC, NAN)), d_dW(Vf(W2.size(), NAN)), d_scratch(scratch.size()), d_dbias0(OC), d_dW0(W2.size());
  t.gpu().matmul_gelu_backward_bf16(d_dpre0.get(), d_dbias0.get(), d_dW0.get(), d_dout.get(), d_gelu.get(),
                                    d_W2.get(), d_out0.get(), N, OC, C2, d_scratch.get());  // another "pre"
  const auto before_bwd = launches();
  t.gpu().matmul_gelu_backward_bf16(d_dpre.get(), d_dbias.get(), d_dW.get(), d_dout.get(), d_gelu.get(), d_W2.get(),
                                    d_cpu_pre.get(), N, OC, C2, d_scratch.get());
  t.sync();
  if (kEmulated) {
    EXPECT_EQ(launches() == before_bwd, fused) << "backward: kernels of zoe's ran (or none)";
  }
  EXPECT_LT(rel_err(widened(d_dpre.download()), widened(dpre)), 1.0 / 128 + kBwdTol) << "dpre";
  EXPECT_LT(rel_err(d_dbias.download(), dbias), kBwdTol) << "dbias";
  EXPECT_LT(rel_err(d_dW.download(), dW), kBwdTol) << "dW";
}

TEST_F(CudaModelOpsTest, GeluInTheProductsEpilogue) {
  check_gelu_fusion(*this, 33, 16, 64, /*fused=*/true, 120);
  check_gelu_fusion(*this, 7, 24, 36, /*fused=*/false, 121);  // 36 rows: not a multiple of 8
  if (!kFull) return;
  check_gelu_fusion(*this, 1024, 768, 3072, /*fused=*/true, 122);
}

// Where cuBLASLt takes an epilogue's vector only in D's type (its documented default: the fp32
// vector zoe passes beside a bf16 D may then be refused by the heuristic, or offered by it and
// refused at the call), the bf16 products' epilogues run as zoe's own passes, to the same bounds
// and with no error. The emulation plays both such libraries (CUDA_EMU_LT_BIAS_IN_D_TYPE).
TEST_F(CudaModelOpsTest, AnEpilogueTheLibraryRefusesRunsAsSeparatePasses) {
  if (!kEmulated) GTEST_SKIP() << "the emulation plays a library that refuses; a GPU's is what it is";
  struct Unset {
    ~Unset() { unsetenv("CUDA_EMU_LT_BIAS_IN_D_TYPE"); }
  } unset;
  const int N = 33, C = 16, OC = 64;
  const auto W = bf16_weights(int64_t{C} * OC, 130), inp16 = bf16_weights(int64_t{N} * C, 131);
  const Vf bias = rnd(OC, 132);
  std::vector<uint16_t> want(int64_t{N} * OC);
  cpu().matmul_forward_bf16(want.data(), inp16.data(), W.data(), bias.data(), N, C, OC);
  for (const char* where : {"heuristic", "call"}) {
    SCOPED_TRACE(std::string("refused at the ") + where);
    setenv("CUDA_EMU_LT_BIAS_IN_D_TYPE", where, 1);
    ops_ = gpu::make_cuda_model_ops(stream_);  // no plan cached from before
    DevH d_W(W), d_inp(inp16), d_out(want.size());
    DevF d_bias(bias);
    const size_t held = static_cast<gpu::CudaModelOps&>(gpu()).workspace_bytes();
    gpu().matmul_forward_bf16(d_out.get(), d_inp.get(), d_W.get(), d_bias.get(), N, C, OC);
    sync();
    EXPECT_GT(static_cast<gpu::CudaModelOps&>(gpu()).workspace_bytes(), held) << "the epilogue path ran";
    EXPECT_LT(rel_err(widened(d_out.download()), widened(want)), 1.0 / 256 + kFwdTol);
    check_gelu_fusion(*this, 33, 16, 64, /*fused=*/false, 133);
  }
}

// An empty batch still writes the bias gradient (zeros), as the CPU reference does, on the
// epilogue's path and on the passes' alike.
TEST_F(CudaModelOpsTest, AnEmptyBatchWritesZerosForTheGeluBiasGradient) {
  const int C = 16, OC = 64;
  const auto W2 = bf16_weights(int64_t{OC} * C, 140);
  DevH d_W2(W2), d_none(1);
  DevF d_dbias(Vf(OC, NAN)), d_dW(Vf(W2.size(), NAN)), d_scratch(1);
  gpu().matmul_gelu_backward_bf16(d_none.get(), d_dbias.get(), d_dW.get(), d_none.get(), d_none.get(), d_W2.get(),
                                  d_none.get(), 0, OC, C, d_scratch.get());
  sync();
  EXPECT_EQ(d_dbias.download(), Vf(OC, 0.f));
}

// Whether this binary's CUDA backend has cuDNN (CMake's ZOE_CUDNN; never the emulation's).
bool built_with_cudnn() { return gpu::CudnnAttention::version_text().rfind("cuDNN 9.", 0) == 0; }

// The bf16 attention on tensor cores (zoe's kernels) against the fp32 attention on the same q,
// k, v: P, dout and dS are rounded to bf16 where the products take them (as FlashAttention
// rounds them), so within kMmaTol, a few bf16 roundings, not fp32's tolerance; the log-sum-exp
// (fp32 scores of exact bf16 products) within fp32's. Reruns are bitwise equal, and the fp32
// kernels on the same input give other bits: the tensor-core path is the one that ran. With
// `cudnn`, cuDNN's fused attention too (where the build has it), held to the same bounds
// (building its plans costs a GPU seconds a shape: a few shapes only).
void check_bf16_attention(CudaModelOpsTest& t, int B, int T, int C, int NH, uint64_t seed, bool cudnn = false) {
  SCOPED_TRACE("bf16 attention B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " NH=" + std::to_string(NH));
  constexpr double kMmaTol = 1.0 / 64;
  const int64_t NC = int64_t{B} * T * C, rows = int64_t{B} * NH * T;
  std::vector<uint16_t> qkv16(3 * NC);
  gpt2::round_to_bf16(qkv16.data(), rnd(3 * NC, seed).data(), 3 * NC);
  const Vf qkv = widened(qkv16), dout = rnd(NC, seed + 1), dqkv0(3 * NC, 0.f);
  Vf att(NC), lse(rows), dqkv = dqkv0;
  t.cpu().attention_forward(att.data(), lse.data(), qkv.data(), B, T, C, NH);
  t.cpu().attention_backward(dqkv.data(), dout.data(), att.data(), qkv.data(), lse.data(), B, T, C, NH);
  struct Run {
    Vf out, lse, dqkv, dbias;
  };
  auto run = [&](gpu::CudaModelOps::AttentionKernels kernels) {
    static_cast<gpu::CudaModelOps&>(t.gpu()).set_attention_kernels(kernels);
    DevH d_att(NC), d_qkv(qkv16), d_dqkv(3 * NC);
    DevF d_lse(rows), d_dout(dout), d_dbias(3 * C);
    t.gpu().attention_forward_bf16(d_att.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
    t.gpu().attention_backward_bf16(d_dqkv.get(), d_dbias.get(), d_dout.get(), d_att.get(), d_qkv.get(), d_lse.get(),
                                    B, T, C, NH, /*overwrite=*/true);
    t.sync();
    return Run{widened(d_att.download()), d_lse.download(), widened(d_dqkv.download()), d_dbias.download()};
  };
  using K = gpu::CudaModelOps::AttentionKernels;
  auto& ops = static_cast<gpu::CudaModelOps&>(t.gpu());
  const Run tc = run(K::kTensorCores);
  const Run again = run(K::kTensorCores);
  const Run fp32 = run(K::kFp32);
  // cuDNN's fused attention where this build has it: on a GPU it must run every head size that
  // is a multiple of 8 (GPT-2's 64 among them); the emulation has none.
  const Status dnn_status =
      cudnn ? ops.cudnn_attention_status(B, T, C, NH) : Status::Unsupported("not asked for at this shape");
  if (cudnn) {
    if (!built_with_cudnn()) {
      EXPECT_FALSE(dnn_status.ok());
    } else if ((C / NH) % 8 == 0) {
      EXPECT_TRUE(dnn_status.ok()) << dnn_status.message();
    }
  }
  std::vector<std::pair<const char*, Run>> paths = {{"tensor cores", tc}};
  if (dnn_status.ok()) {
    paths.emplace_back("cuDNN", run(K::kCudnn));
    const Run dnn_again = run(K::kCudnn);
    EXPECT_TRUE(bitwise_equal(paths.back().second.dqkv, dnn_again.dqkv) &&
                bitwise_equal(paths.back().second.dbias, dnn_again.dbias))
        << "a rerun of cuDNN's backward differs (its deterministic algorithm was asked for)";
  } else if (cudnn) {
    std::printf("  bf16 attention B=%d T=%d C=%d NH=%d: cuDNN not run: %s\n", B, T, C, NH,
                dnn_status.message().c_str());
  }
  ops.set_attention_kernels(K::kAuto);
  // q, k and v separately, each against its own scale, or 1/100 of the largest part's where its
  // gradient vanishes (one key: the softmax is constant, dq and dk are zero).
  double scale[3], largest = 0;
  for (int part = 0; part < 3; part++) {
    scale[part] = max_abs_diff(qkv_part(dqkv, part, C), qkv_part(dqkv0, part, C));
    largest = std::max(largest, scale[part]);
  }
  // The bias gradient: the column sums of dqkv, within the gradient's own error.
  Vf sums(3 * C, 0.f);
  for (int64_t r = 0; r < int64_t{B} * T; r++)
    for (int c = 0; c < 3 * C; c++) sums[c] += dqkv[r * 3 * C + c];
  for (const auto& [path, r] : paths) {
    SCOPED_TRACE(path);
    const double out_err = rel_err(r.out, att);
    EXPECT_LT(out_err, kMmaTol) << "out";
    EXPECT_LT(rel_err(r.lse, lse), kFwdTol) << "lse";
    for (int part = 0; part < 3; part++) {
      const double err = max_abs_diff(qkv_part(r.dqkv, part, C), qkv_part(dqkv, part, C)) /
                         std::max({scale[part], largest / 100, 1e-30});
      EXPECT_LT(err, kMmaTol) << "d" << "qkv"[part];
      std::printf("  bf16 attention B=%d T=%d C=%d NH=%d, %s: d%c %.2e of its largest value (out %.2e)\n", B, T, C,
                  NH, path, "qkv"[part], err, out_err);
    }
    EXPECT_LT(rel_err(r.dbias, sums), kMmaTol) << "dbias";
  }
  EXPECT_TRUE(bitwise_equal(tc.out, again.out) && bitwise_equal(tc.dqkv, again.dqkv) &&
              bitwise_equal(tc.dbias, again.dbias))
      << "a rerun differs";
  // dqkv is stored rounded (the fp32 kernels' may round to the same bits where T is 1); c_attn's
  // dbias, summed from the unrounded values, tells the paths apart.
  EXPECT_FALSE(bitwise_equal(tc.dqkv, fp32.dqkv) && bitwise_equal(tc.dbias, fp32.dbias))
      << "the tensor-core path gave the fp32 kernels' bits";
}

TEST_F(CudaModelOpsTest, Bf16AttentionOnTensorCores) {
  check_bf16_attention(*this, 1, 1, 8, 2, 80);     // hs 4, one query
  check_bf16_attention(*this, 2, 7, 64, 2, 81);    // hs 32
  check_bf16_attention(*this, 1, 150, 64, 2, 82, /*cudnn=*/true);  // hs 32, 3 tiles of 64, the last one short
  check_bf16_attention(*this, 2, 65, 96, 2, 83);   // hs 48 (padded to 64), a tile and one row
  check_bf16_attention(*this, 1, 130, 200, 2, 84, /*cudnn=*/true);  // hs 100 (padded to 128): not cuDNN's
  if (!kFull) return;
  check_bf16_attention(*this, 2, 200, 768, 12, 85);  // GPT-2's heads
  check_bf16_attention(*this, 2, 256, 256, 2, 86);   // hs 128
  if (kEmulated) return;
  check_bf16_attention(*this, 2, 1024, 768, 12, 87, /*cudnn=*/true);
}

// cuDNN where the build has it: its version is named and its graphs validated without a GPU, and
// without a GPU, create() says why instead of failing later (CudaModelOps then runs zoe's kernels).
TEST(CudnnAttentionTest, NamesItsVersionAndWithoutAGpuSaysWhy) {
  const std::string v = gpu::CudnnAttention::version_text();
  std::printf("  %s\n", v.c_str());
  if (!built_with_cudnn()) {
    EXPECT_NE(v.find("no cuDNN"), std::string::npos) << v;
  }
  // The frontend's host-side checks of the graphs this layout makes, for a Hopper GPU (no GPU needed): GPT-2's heads
  // and a short odd sequence pass; a head size that is not a multiple of 8 is refused, named.
  if (built_with_cudnn()) {
    for (const auto& [B, T, C, NH] : {std::array<int, 4>{8, 1024, 768, 12}, {1, 150, 64, 2}, {2, 65, 96, 2}}) {
      const Status ok = gpu::CudnnAttention::validate(B, T, C, NH, 90);
      EXPECT_TRUE(ok.ok()) << ok.message();
    }
    const Status bad = gpu::CudnnAttention::validate(1, 130, 200, 2, 90);  // head size 100
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(bad.message().find("cuDNN's forward attention (B 1, T 130, C 200, NH 2) at validate"),
              std::string::npos)
        << bad.message();
  } else {
    EXPECT_FALSE(gpu::CudnnAttention::validate(8, 1024, 768, 12, 90).ok());
  }
  std::string why;
  if (!gpu::list_gpus(&why).empty())
    GTEST_SKIP() << "a GPU (or the emulation's) is here: create() is left to Bf16AttentionOnTensorCores";
  std::unique_ptr<gpu::CudnnAttention> a;
  const Status s = gpu::CudnnAttention::create(nullptr, gpu::cuda_raw_memory(), &a);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(a, nullptr);
  EXPECT_FALSE(s.message().empty());
  std::printf("  without a GPU: %s\n", s.message().c_str());
}

// ZOE_CUDA_ATTENTION, read where the ops are made: a value it does not know is the ops' error,
// naming it; "cudnn" where cuDNN cannot run the shape fails the op, naming why (zoe's kernels do
// not stand in); "mma" runs zoe's tensor-core kernels, the same bits as asking for them.
TEST_F(CudaModelOpsTest, ZoeCudaAttentionPicksTheKernels) {
  struct Env {
    explicit Env(const char* v) { setenv("ZOE_CUDA_ATTENTION", v, 1); }
    ~Env() { unsetenv("ZOE_CUDA_ATTENTION"); }
  };
  auto status_of = [](ModelOps& o) { return static_cast<gpu::CudaModelOps&>(o).status(); };
  {
    const Env env("flash");
    const auto ops = gpu::make_cuda_model_ops(stream_);
    const Status s = status_of(*ops);
    EXPECT_EQ(s.code(), Code::kInvalidInput);
    EXPECT_NE(s.message().find("ZOE_CUDA_ATTENTION='flash'"), std::string::npos) << s.message();
  }
  const int B = 1, T = 9, C = 8, NH = 2;  // head size 4: not a multiple of 8, no engine of cuDNN's
  std::vector<uint16_t> qkv16(3 * B * T * C);
  gpt2::round_to_bf16(qkv16.data(), rnd(qkv16.size(), 90).data(), int64_t(qkv16.size()));
  const DevH d_qkv(qkv16);
  DevH d_out(B * T * C);
  DevF d_lse(B * NH * T);
  {
    const Env env("cudnn");
    const auto ops = gpu::make_cuda_model_ops(stream_);
    ops->attention_forward_bf16(d_out.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const Status s = status_of(*ops);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("attention_forward_bf16(B 1, T 9, C 8, NH 2): ZOE_CUDA_ATTENTION=cudnn: "),
              std::string::npos)
        << s.message();
  }
  std::vector<uint16_t> by_env;
  {
    const Env env("mma");
    const auto ops = gpu::make_cuda_model_ops(stream_);
    ops->attention_forward_bf16(d_out.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    ASSERT_TRUE(status_of(*ops).ok()) << status_of(*ops).message();
    by_env = d_out.download();
  }
  static_cast<gpu::CudaModelOps&>(gpu()).set_attention_kernels(gpu::CudaModelOps::AttentionKernels::kFp32);
  gpu().attention_forward_bf16(d_out.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
  sync();
  const std::vector<uint16_t> fp32 = d_out.download();
  static_cast<gpu::CudaModelOps&>(gpu()).set_attention_kernels(gpu::CudaModelOps::AttentionKernels::kTensorCores);
  gpu().attention_forward_bf16(d_out.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
  sync();
  EXPECT_EQ(by_env, d_out.download());
  EXPECT_NE(by_env, fp32) << "the tensor-core and fp32 kernels gave the same bits: the check sees nothing";
}

// Benchmarks' breakdowns on a GPU: each op's time from events around it on the compute stream,
// per op name, the ops an op runs inside it counted as its own (matmul_backward zeroes through
// `zero`); the first call starts the timing, a call after no ops gives nothing. An event made
// without timing has no elapsed time, as CUDA says.
TEST_F(CudaModelOpsTest, OpSecondsComeFromEventsAroundEachOp) {
  EXPECT_TRUE(gpu().take_op_seconds().empty());
  const int N = 64, C = 32, OC = 48;
  DevF inp(rnd(int64_t{N} * C, 1)), W(rnd(int64_t{OC} * C, 2)), bias(rnd(OC, 3)), out(int64_t{N} * OC);
  DevF dinp(int64_t{N} * C), dW(int64_t{OC} * C), dbias(OC), dout(rnd(int64_t{N} * OC, 4));
  gpu().matmul_forward(out.get(), inp.get(), W.get(), bias.get(), N, C, OC);
  gpu().gelu_forward(out.get(), out.get(), int64_t{N} * OC);
  gpu().gelu_forward(out.get(), out.get(), int64_t{N} * OC);
  gpu().matmul_backward(dinp.get(), dW.get(), dbias.get(), dout.get(), inp.get(), W.get(), N, C, OC);
  const std::map<std::string, double> seconds = gpu().take_op_seconds();
  sync();
  std::vector<std::string> names;
  for (const auto& [name, s] : seconds) {
    names.push_back(name);
    EXPECT_GT(s, 0.0) << name;
    EXPECT_LT(s, 60.0) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"gelu_forward", "matmul_backward", "matmul_forward"}));
  EXPECT_TRUE(gpu().take_op_seconds().empty());

  cudaEvent_t timed = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&timed, cudaEventDefault), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(timed, stream_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  float ms = 0.f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, untimed), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, timed), cudaSuccess);
  EXPECT_EQ(ms, 0.f);
  cudaEventDestroy(timed);
  cudaEventDestroy(untimed);
}

TEST_F(CudaModelOpsTest, Bf16Encoder) {
  const int B = 2, T = 5, C = 8, V = 11;
  const auto wte = bf16_weights(int64_t{V} * C, 95), wpe = bf16_weights(int64_t{T} * C, 96);
  const Vi inp = tokens(int64_t{B} * T, V, 97);
  DevH d_wte(wte), d_wpe(wpe);
  DevI d_inp(inp);
  DevF d_out(int64_t{B} * T * C);
  Vf out(int64_t{B} * T * C);
  cpu().encoder_forward_bf16(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  gpu().encoder_forward_bf16(d_out.get(), d_inp.get(), d_wte.get(), d_wpe.get(), B, T, C);
  sync();
  EXPECT_TRUE(bitwise_equal(d_out.download(), out));
}

}  // namespace
}  // namespace zoe

#else  // !ZOE_HAVE_CUDA

TEST(CudaModelOpsTest, Skipped) { GTEST_SKIP() << "built without CUDA (ZOE_HAVE_CUDA is not defined)"; }

#endif

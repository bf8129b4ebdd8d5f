// GPT-2 CPU ops: fp32 ops vs the float64 reference (gpt2_ops_ref.h), the reference's backward vs
// central finite differences, and the composed block / tiny model the engine will run.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/gpt2_block.h"
#include "model/gpt2_config.h"
#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_ref.h"
#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {
namespace {

using Vd = std::vector<double>;
using Vf = std::vector<float>;

// Random values that are exactly representable in float, so fp32 and f64 see the same inputs.
Vd rnd(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Vd v(n);
  for (auto& x : v) x = static_cast<float>(u(g));
  return v;
}
Vf to_f(const Vd& v) { return Vf(v.begin(), v.end()); }
std::vector<int32_t> tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % V);
  return t;
}
double dot(const Vd& a, const Vd& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// max |got - want| / max |want|: error relative to the tensor's scale.
template <class A>
double rel_err(const A& got, const Vd& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); i++) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

// Checks `analytic` = d loss / d x by central differences on x (restored afterwards).
void expect_fd(const char* what, Vd& x, const Vd& analytic, const std::function<double()>& loss,
               double tol = 1e-6) {
  const double h = 1e-6;
  Vd num(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    num[i] = (lp - lm) / (2 * h);
  }
  EXPECT_LT(rel_err(analytic, num), tol) << what;
}

constexpr double kFwdTol = 1e-5;  // fp32 forward vs f64
constexpr double kBwdTol = 1e-4;  // fp32 backward vs f64 analytic

// ---- vector exp -----------------------------------------------------------------------------

TEST(Gpt2Ops, ExpApprox) {
  std::vector<float> x, y(20001);
  for (int i = 0; i <= 20000; i++) x.push_back(-87.f + 175.f * i / 20000);
  detail::exp_shift_sum(y.data(), x.data(), 0.f, x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); i++) {
    const double want = std::exp(double(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  EXPECT_LT(worst, 5e-7);
  // The sum, as softmax uses it: shifted by the max, 1003 terms (not a multiple of 8).
  const float sum = detail::exp_shift_sum(nullptr, x.data() + 8000, x[9002], 1003);
  double want_sum = 0;
  for (int i = 8000; i < 9003; i++) want_sum += std::exp(double(x[i]) - x[9002]);
  EXPECT_NEAR(sum / want_sum, 1.0, 1e-6);
  // Outside [-87, 88] the argument is clamped: tiny or large, never 0 * inf or NaN.
  const float far[3] = {-1000.f, 1000.f, 3.f};
  float e[3];
  detail::exp_shift_sum(e, far, 0.f, 3);
  EXPECT_LT(e[0], 1e-37f);
  EXPECT_TRUE(std::isfinite(e[1]) && e[1] > 1e38f);
  EXPECT_NEAR(e[2], std::exp(3.0), 1e-5);
  EXPECT_EQ(detail::max_of(x.data(), x.size()), 88.f);
}

// ---- encoder --------------------------------------------------------------------------------

TEST(Gpt2Ops, Encoder) {
  const int B = 2, T = 5, C = 8, V = 11, maxT = 7;
  auto inp = tokens(B * T, V, 1);
  inp[3] = inp[7];  // a repeated token: its dwte row gets two contributions
  Vd wte = rnd(V * C, 2), wpe = rnd(maxT * C, 3), dout = rnd(B * T * C, 4);
  Vd out(B * T * C);
  ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  Vf outf(out.size());
  encoder_forward(outf.data(), inp.data(), to_f(wte).data(), to_f(wpe).data(), B, T, C);
  EXPECT_LT(rel_err(outf, out), kFwdTol);

  Vd dwte = rnd(V * C, 5), dwpe = rnd(maxT * C, 6);  // nonzero: backward must accumulate
  Vf dwtef = to_f(dwte), dwpef = to_f(dwpe);
  Vd g_wte(V * C), g_wpe(maxT * C);
  ref::encoder_backward(g_wte.data(), g_wpe.data(), dout.data(), inp.data(), B, T, C);
  auto loss = [&] {
    ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, dout);
  };
  expect_fd("dwte", wte, g_wte, loss);
  expect_fd("dwpe", wpe, g_wpe, loss);
  encoder_backward(dwtef.data(), dwpef.data(), to_f(dout).data(), inp.data(), B, T, C);
  for (size_t i = 0; i < dwte.size(); i++) dwte[i] += g_wte[i];
  for (size_t i = 0; i < dwpe.size(); i++) dwpe[i] += g_wpe[i];
  EXPECT_LT(rel_err(dwtef, dwte), kBwdTol);
  EXPECT_LT(rel_err(dwpef, dwpe), kBwdTol);
}

// ---- layernorm ------------------------------------------------------------------------------

void check_layernorm(int N, int C) {
  Vd x = rnd(N * C, 10, -2, 3), w = rnd(C, 11), b = rnd(C, 12), dout = rnd(N * C, 13);
  Vd out(N * C), mean(N), rstd(N);
  ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  Vf outf(N * C), meanf(N), rstdf(N);
  layernorm_forward(outf.data(), meanf.data(), rstdf.data(), to_f(x).data(), to_f(w).data(),
                    to_f(b).data(), N, C);
  EXPECT_LT(rel_err(outf, out), kFwdTol);
  EXPECT_LT(rel_err(meanf, mean), kFwdTol);
  EXPECT_LT(rel_err(rstdf, rstd), kFwdTol);

  Vd dx(N * C), dw(C), db(C);
  ref::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  Vd m2(N), r2(N);
  auto loss = [&] {
    ref::layernorm_forward(out.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, dout);
  };
  expect_fd("ln dx", x, dx, loss);
  expect_fd("ln dw", w, dw, loss);
  expect_fd("ln db", b, db, loss);

  Vd dx0 = rnd(N * C, 14), dw0 = rnd(C, 15), db0 = rnd(C, 16);
  Vf dxf = to_f(dx0), dwf = to_f(dw0), dbf = to_f(db0);
  layernorm_backward(dxf.data(), dwf.data(), dbf.data(), to_f(dout).data(), to_f(x).data(),
                     to_f(w).data(), meanf.data(), rstdf.data(), N, C);
  for (int i = 0; i < N * C; i++) dx0[i] += dx[i];
  for (int c = 0; c < C; c++) dw0[c] += dw[c], db0[c] += db[c];
  EXPECT_LT(rel_err(dxf, dx0), kBwdTol);
  EXPECT_LT(rel_err(dwf, dw0), kBwdTol);
  EXPECT_LT(rel_err(dbf, db0), kBwdTol);
}

TEST(Gpt2Ops, LayerNorm) {
  check_layernorm(10, 8);
  check_layernorm(7, 13);
  check_layernorm(200, 5);  // more rows than one reduction chunk
}

// Rows are normalised several at a time (their sums side by side); each row's sums keep the order
// of a row alone, so a call over N rows is bitwise N calls over one row each, fp32 and bf16.
TEST(Gpt2Ops, LayerNormRowsTogetherAreBitwiseEachRowAlone) {
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int N : {1, 7, 8, 9, 37}) {
    for (int C : {5, 384}) {
      Vf x(size_t(N) * C), w(C), b(C);
      for (float& v : x) v = u(g) + 30.f;  // a large mean: long chains of rounding
      for (float& v : w) v = u(g);
      for (float& v : b) v = u(g);
      Vf out(x.size()), mean(N), rstd(N), out1(x.size()), mean1(N), rstd1(N);
      std::vector<uint16_t> h(x.size()), h1(x.size());
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      layernorm_forward_bf16(h.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      for (int r = 0; r < N; r++) {
        const int64_t o = int64_t{r} * C;
        layernorm_forward(out1.data() + o, &mean1[r], &rstd1[r], x.data() + o, w.data(), b.data(), 1, C);
        layernorm_forward_bf16(h1.data() + o, &mean1[r], &rstd1[r], x.data() + o, w.data(), b.data(), 1, C);
      }
      SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
      EXPECT_EQ(0, std::memcmp(out.data(), out1.data(), out.size() * 4));
      EXPECT_EQ(0, std::memcmp(mean.data(), mean1.data(), mean.size() * 4));
      EXPECT_EQ(0, std::memcmp(rstd.data(), rstd1.data(), rstd.size() * 4));
      EXPECT_EQ(0, std::memcmp(h.data(), h1.data(), h.size() * 2));
    }
  }
}

// ---- matmul and LM head ---------------------------------------------------------------------

// w_t: the LM head (W is wte [OC, C], no bias); otherwise a Conv1D linear layer.
void check_matmul(int N, int C, int OC, bool with_bias, bool w_t) {
  Vd x = rnd(N * C, 20), W = rnd(C * OC, 21), bias = rnd(OC, 22), dout = rnd(N * OC, 23);
  const double* bp = with_bias ? bias.data() : nullptr;
  Vd out(N * OC);
  ref::matmul_forward(out.data(), x.data(), W.data(), bp, N, C, OC, w_t);
  Vf outf(N * OC), xf = to_f(x), Wf = to_f(W), bf = to_f(bias);
  if (w_t)
    lm_head_forward(outf.data(), xf.data(), Wf.data(), N, C, OC);
  else
    matmul_forward(outf.data(), xf.data(), Wf.data(), with_bias ? bf.data() : nullptr, N, C, OC);
  EXPECT_LT(rel_err(outf, out), kFwdTol);

  Vd dx(N * C), dW(C * OC), db(OC);
  ref::matmul_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), N, C, OC,
                       w_t);
  auto loss = [&] {
    ref::matmul_forward(out.data(), x.data(), W.data(), with_bias ? bias.data() : nullptr, N, C,
                        OC, w_t);
    return dot(out, dout);
  };
  expect_fd("mm dx", x, dx, loss);
  expect_fd("mm dW", W, dW, loss);
  if (with_bias) expect_fd("mm db", bias, db, loss);

  Vd dx0 = rnd(N * C, 24), dW0 = rnd(C * OC, 25), db0 = rnd(OC, 26);
  Vf dxf = to_f(dx0), dWf = to_f(dW0), dbf = to_f(db0);
  if (w_t)
    lm_head_backward(dxf.data(), dWf.data(), to_f(dout).data(), xf.data(), Wf.data(), N, C, OC);
  else
    matmul_backward(dxf.data(), dWf.data(), with_bias ? dbf.data() : nullptr, to_f(dout).data(),
                    xf.data(), Wf.data(), N, C, OC);
  for (size_t i = 0; i < dx0.size(); i++) dx0[i] += dx[i];
  for (size_t i = 0; i < dW0.size(); i++) dW0[i] += dW[i];
  if (with_bias)
    for (int o = 0; o < OC; o++) db0[o] += db[o];
  EXPECT_LT(rel_err(dxf, dx0), kBwdTol);
  EXPECT_LT(rel_err(dWf, dW0), kBwdTol);
  EXPECT_LT(rel_err(dbf, db0), kBwdTol);  // untouched when there is no bias
}

TEST(Gpt2Ops, Matmul) {
  check_matmul(10, 8, 24, true, false);
  check_matmul(7, 5, 13, true, false);
  check_matmul(9, 6, 3, false, false);
}

TEST(Gpt2Ops, LmHead) {
  check_matmul(10, 8, 11, false, true);
  check_matmul(3, 7, 5, false, true);
}

// ---- attention ------------------------------------------------------------------------------

void check_attention(int B, int T, int C, int NH) {
  Vd qkv = rnd(B * T * 3 * C, 30, -2, 2), dout = rnd(B * T * C, 31);
  Vd out(B * T * C), att(B * NH * T * T);
  ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vf outf(B * T * C), lse(B * NH * T), qkvf = to_f(qkv);
  attention_forward(outf.data(), lse.data(), qkvf.data(), B, T, C, NH);
  EXPECT_LT(rel_err(outf, out), kFwdTol);

  Vd dqkv(qkv.size());
  ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  Vd att2(att.size());
  auto loss = [&] {
    ref::attention_forward(out.data(), att2.data(), qkv.data(), B, T, C, NH);
    return dot(out, dout);
  };
  expect_fd("attn dqkv", qkv, dqkv, loss);

  Vd dqkv0 = rnd(qkv.size(), 32);
  Vf dqkvf = to_f(dqkv0);
  attention_backward(dqkvf.data(), to_f(dout).data(), outf.data(), qkvf.data(), lse.data(), B, T, C, NH);
  for (size_t i = 0; i < dqkv0.size(); i++) dqkv0[i] += dqkv[i];
  EXPECT_LT(rel_err(dqkvf, dqkv0), kBwdTol);
}

TEST(Gpt2Ops, Attention) {
  check_attention(2, 5, 8, 2);
  check_attention(1, 7, 12, 3);   // odd T, 3 heads of size 4
  check_attention(3, 4, 10, 5);   // head size 2
  check_attention(1, 1, 6, 1);    // one position attends only to itself
  check_attention(1, 19, 48, 2);  // tiles of 16 keys / head dims, then a tail of 8
}

// A query whose score is far above the rest: softmax must not overflow and backward must
// rebuild the probabilities from lse exactly.
TEST(Gpt2Ops, AttentionLargeScores) {
  const int B = 1, T = 6, C = 4, NH = 1;
  Vd qkv = rnd(B * T * 3 * C, 33, -1, 1);
  for (int d = 0; d < C; d++) qkv[5 * 3 * C + d] = 30, qkv[2 * 3 * C + C + d] = 30;
  Vd out(B * T * C), att(T * T), dout = rnd(B * T * C, 34);
  ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vf outf(out.size()), lse(T), qkvf = to_f(qkv);
  attention_forward(outf.data(), lse.data(), qkvf.data(), B, T, C, NH);
  EXPECT_LT(rel_err(outf, out), kFwdTol);
  Vd dqkv(qkv.size());
  ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  Vf dqkvf(qkv.size());
  attention_backward(dqkvf.data(), to_f(dout).data(), outf.data(), qkvf.data(), lse.data(), B, T, C, NH);
  EXPECT_LT(rel_err(dqkvf, dqkv), kBwdTol);
}

// ---- gelu, residual -------------------------------------------------------------------------

TEST(Gpt2Ops, Gelu) {
  const int N = 37;
  Vd x = rnd(N, 40, -5, 5), dout = rnd(N, 41), out(N);
  x[0] = 0, x[1] = 12, x[2] = -12;  // the saturated tails
  ref::gelu_forward(out.data(), x.data(), N);
  Vf outf(N);
  gelu_forward(outf.data(), to_f(x).data(), N);
  EXPECT_LT(rel_err(outf, out), kFwdTol);
  Vd dx(N);
  ref::gelu_backward(dx.data(), x.data(), dout.data(), N);
  expect_fd("gelu dx", x, dx, [&] {
    ref::gelu_forward(out.data(), x.data(), N);
    return dot(out, dout);
  });
  Vd dx0 = rnd(N, 42);
  Vf dxf = to_f(dx0);
  gelu_backward(dxf.data(), to_f(x).data(), to_f(dout).data(), N);
  for (int i = 0; i < N; i++) dx0[i] += dx[i];
  EXPECT_LT(rel_err(dxf, dx0), kBwdTol);
  Vf inplace = to_f(x);  // out may alias inp
  gelu_forward(inplace.data(), inplace.data(), N);
  EXPECT_EQ(inplace, outf);
}

// GELU runs 16 lanes a step where it can, then 8, then a tail: each element gets the same bits
// whichever of them computed it (calls of 8 elements run on the 8-lane path alone).
TEST(Gpt2Ops, GeluBitsDoNotDependOnTheVectorWidth) {
  const int N = 16 * 5 + 8 + 3;
  Vf x = to_f(rnd(N, 43, -6, 6)), dout = to_f(rnd(N, 44)), dx0 = to_f(rnd(N, 45));
  Vf out(N), out8(N), dx = dx0, dx8 = dx0;
  gelu_forward(out.data(), x.data(), N);
  gelu_backward(dx.data(), x.data(), dout.data(), N, /*overwrite=*/false);
  for (int i = 0; i < N; i += 8) {
    const int n = std::min(8, N - i);
    gelu_forward(out8.data() + i, x.data() + i, n);
    gelu_backward(dx8.data() + i, x.data() + i, dout.data() + i, n, /*overwrite=*/false);
  }
  EXPECT_EQ(std::memcmp(out.data(), out8.data(), sizeof(float) * N), 0);
  EXPECT_EQ(std::memcmp(dx.data(), dx8.data(), sizeof(float) * N), 0);
}

TEST(Gpt2Ops, Residual) {
  const int N = 50000;  // more than one task
  Vd a = rnd(N, 50), b = rnd(N, 51), dout = rnd(N, 52), out(N);
  ref::residual_forward(out.data(), a.data(), b.data(), N);
  Vf outf(N), af = to_f(a);
  residual_forward(outf.data(), af.data(), to_f(b).data(), N);
  EXPECT_LT(rel_err(outf, out), kFwdTol);
  Vd da(N), db(N);
  ref::residual_backward(da.data(), db.data(), dout.data(), N);
  Vd small_a(a.begin(), a.begin() + 20), small_da(da.begin(), da.begin() + 20);
  expect_fd("residual da", small_a, small_da, [&] {
    double s = 0;
    for (int i = 0; i < 20; i++) s += (small_a[i] + b[i]) * dout[i];
    return s;
  });
  Vd da0 = rnd(N, 53), db0 = rnd(N, 54);
  Vf daf = to_f(da0), dbf = to_f(db0);
  residual_backward(daf.data(), dbf.data(), to_f(dout).data(), N);
  for (int i = 0; i < N; i++) da0[i] += da[i], db0[i] += db[i];
  EXPECT_LT(rel_err(daf, da0), kBwdTol);
  EXPECT_LT(rel_err(dbf, db0), kBwdTol);
  residual_forward(af.data(), af.data(), to_f(b).data(), N);  // out may alias inp1
  EXPECT_EQ(af, outf);
}

// ---- cross-entropy --------------------------------------------------------------------------

TEST(Gpt2Ops, CrossEntropy) {
  const int N = 10, V = 11;
  Vd logits = rnd(N * V, 60, -4, 4);
  logits[5] = 40;  // a dominant logit: exp must not overflow
  auto tgt = tokens(N, V, 61);
  tgt[0] = 5;
  // d(mean loss)/d logits is (softmax - onehot) / N.
  Vd dl(N * V);
  double loss = ref::crossentropy_forward_backward(dl.data(), logits.data(), tgt.data(), N, V,
                                                   1.0 / N);
  expect_fd("ce dlogits", logits, dl, [&] {
    return ref::crossentropy_forward_backward<double>(nullptr, logits.data(), tgt.data(), N, V, 1);
  });
  const float dscale = 1024.f / N;  // e.g. loss scale 1024 over N positions
  Vf lf = to_f(logits), dlf(N * V), losses(N);
  float lossf = crossentropy_forward_backward(dlf.data(), losses.data(), lf.data(), tgt.data(), N,
                                              V, dscale);
  EXPECT_NEAR(lossf, loss, kFwdTol * loss);
  Vd dl_scaled(dl);
  for (auto& x : dl_scaled) x *= 1024;
  EXPECT_LT(rel_err(dlf, dl_scaled), kBwdTol);
  double sum = 0;
  for (float l : losses) sum += l;
  EXPECT_NEAR(sum / N, loss, kFwdTol * loss);
  // In place: dlogits aliasing logits gives the same numbers.
  float loss2 = crossentropy_forward_backward(lf.data(), nullptr, lf.data(), tgt.data(), N, V,
                                              dscale);
  EXPECT_EQ(loss2, lossf);
  EXPECT_EQ(lf, dlf);
}

// ---- block ----------------------------------------------------------------------------------

// The float64 block, composed from the reference ops exactly as gpt2_block.cc composes fp32 ones.
struct RefBlock {
  BlockDims d;
  int64_t BT, BTC;
  Vd ln1, ln1_m, ln1_r, qkv, att, atty, res1, ln2, ln2_m, ln2_r, fc, fcg;
  explicit RefBlock(const BlockDims& dd)
      : d(dd), BT(int64_t{dd.B} * dd.T), BTC(BT * dd.C), ln1(BTC), ln1_m(BT), ln1_r(BT),
        qkv(3 * BTC), att(int64_t{dd.B} * dd.NH * dd.T * dd.T), atty(BTC), res1(BTC), ln2(BTC),
        ln2_m(BT), ln2_r(BT), fc(4 * BTC), fcg(4 * BTC) {}

  void forward(double* out, const double* params, const double* inp) {
    const auto p = block_tensors(params, d.C);
    const int N = BT, C = d.C;
    ref::layernorm_forward(ln1.data(), ln1_m.data(), ln1_r.data(), inp, p.ln1_w, p.ln1_b, N, C);
    ref::matmul_forward(qkv.data(), ln1.data(), p.qkv_w, p.qkv_b, N, C, 3 * C);
    ref::attention_forward(atty.data(), att.data(), qkv.data(), d.B, d.T, C, d.NH);
    Vd proj(BTC), mlp(BTC);
    ref::matmul_forward(proj.data(), atty.data(), p.attproj_w, p.attproj_b, N, C, C);
    ref::residual_forward(res1.data(), inp, proj.data(), BTC);
    ref::layernorm_forward(ln2.data(), ln2_m.data(), ln2_r.data(), res1.data(), p.ln2_w, p.ln2_b,
                           N, C);
    ref::matmul_forward(fc.data(), ln2.data(), p.fc_w, p.fc_b, N, C, 4 * C);
    ref::gelu_forward(fcg.data(), fc.data(), 4 * BTC);
    ref::matmul_forward(mlp.data(), fcg.data(), p.fcproj_w, p.fcproj_b, N, 4 * C, C);
    ref::residual_forward(out, res1.data(), mlp.data(), BTC);
  }

  // dinp += ..., dparams += ...
  void backward(double* dinp, double* dparams, const double* dout, const double* params,
                const double* inp) {
    const auto p = block_tensors(params, d.C);
    const auto g = block_tensors(dparams, d.C);
    const int N = BT, C = d.C;
    Vd dfcg(4 * BTC), dfc(4 * BTC), dln2(BTC), dres1(BTC), datty(BTC), dqkv(3 * BTC), dln1(BTC);
    Vd dmlp(BTC), dproj(BTC);
    ref::residual_backward(dres1.data(), dmlp.data(), dout, BTC);
    ref::matmul_backward(dfcg.data(), g.fcproj_w, g.fcproj_b, dmlp.data(), fcg.data(), p.fcproj_w,
                         N, 4 * C, C);
    ref::gelu_backward(dfc.data(), fc.data(), dfcg.data(), 4 * BTC);
    ref::matmul_backward(dln2.data(), g.fc_w, g.fc_b, dfc.data(), ln2.data(), p.fc_w, N, C, 4 * C);
    ref::layernorm_backward(dres1.data(), g.ln2_w, g.ln2_b, dln2.data(), res1.data(), p.ln2_w,
                            ln2_m.data(), ln2_r.data(), N, C);
    ref::residual_backward(dinp, dproj.data(), dres1.data(), BTC);
    ref::matmul_backward(datty.data(), g.attproj_w, g.attproj_b, dproj.data(), atty.data(),
                         p.attproj_w, N, C, C);
    ref::attention_backward(dqkv.data(), datty.data(), qkv.data(), att.data(), d.B, d.T, C, d.NH);
    ref::matmul_backward(dln1.data(), g.qkv_w, g.qkv_b, dqkv.data(), ln1.data(), p.qkv_w, N, C,
                         3 * C);
    ref::layernorm_backward(dinp, g.ln1_w, g.ln1_b, dln1.data(), inp, p.ln1_w, ln1_m.data(),
                            ln1_r.data(), N, C);
  }
};

TEST(Gpt2Block, LayoutMatchesConfigUnit) {
  const Gpt2Shape s{3, 2, 8, 11, 7};
  const auto specs = unit_tensors(s, 2);
  ASSERT_EQ(specs.size(), 12u);
  EXPECT_EQ(unit_numel(s, 2), block_numel(8));
  const Vf flat(block_numel(8));
  const float* base = flat.data();
  const auto t = block_tensors(base, 8);
  const float* ptrs[] = {t.ln1_w, t.ln1_b, t.qkv_w, t.qkv_b, t.attproj_w, t.attproj_b,
                         t.ln2_w, t.ln2_b, t.fc_w,  t.fc_b,  t.fcproj_w,  t.fcproj_b};
  for (int i = 0; i < 12; i++) EXPECT_EQ(ptrs[i] - base, specs[i].offset) << specs[i].name;
}

// fp32 block vs the float64 block: forward, then dinp and (accumulated) dparams.
void check_block(const BlockDims& d, bool fd) {
  const int64_t BTC = int64_t{d.B} * d.T * d.C, P = block_numel(d.C);
  Vd params = rnd(P, 70, -0.5, 0.5), inp = rnd(BTC, 71, -2, 2), dout = rnd(BTC, 72);
  RefBlock rb(d);
  Vd out(BTC);
  rb.forward(out.data(), params.data(), inp.data());
  Vf paramsf = to_f(params), inpf = to_f(inp), outf(BTC);
  BlockBuffers buf(d);
  block_forward(host_model_ops(), outf.data(), buf.acts, paramsf.data(), inpf.data(), d);
  EXPECT_LT(rel_err(outf, out), kFwdTol);

  Vd dinp(BTC), dparams(P);
  rb.backward(dinp.data(), dparams.data(), dout.data(), params.data(), inp.data());
  Vf dinpf(BTC), dparamsf = to_f(rnd(P, 73));  // what was there is overwritten, not added to
  block_backward(host_model_ops(), dinpf.data(), dparamsf.data(), to_f(dout).data(), buf.acts, paramsf.data(),
                 inpf.data(), d, buf.scratch.data(), false);
  EXPECT_LT(rel_err(dinpf, dinp), kBwdTol);
  EXPECT_LT(rel_err(dparamsf, dparams), kBwdTol);
  if (!fd) return;
  RefBlock probe(d);
  auto loss = [&] {
    probe.forward(out.data(), params.data(), inp.data());
    return dot(out, dout);
  };
  expect_fd("block dinp", inp, dinp, loss);
  expect_fd("block dparams", params, dparams, loss);
}

TEST(Gpt2Block, MatchesReferenceAndFiniteDifferences) {
  check_block({2, 5, 8, 2}, true);
  check_block({1, 3, 6, 3}, true);
}

TEST(Gpt2Block, MatchesReferenceLarger) {
  check_block({2, 37, 48, 4}, false);  // several TBB tasks and reduction chunks
}

// Recompute must give bitwise the same gradients as keeping the activations, from any scratch
// contents; dinp may alias dout.
TEST(Gpt2Block, RecomputeIsExact) {
  const BlockDims d{2, 9, 16, 4};
  const int64_t BTC = int64_t{d.B} * d.T * d.C, P = block_numel(d.C);
  Vf params = to_f(rnd(P, 80, -0.5, 0.5)), inp = to_f(rnd(BTC, 81)), dout = to_f(rnd(BTC, 82));
  BlockBuffers kept(d), ckpt(d);
  Vf out1(BTC), out2(BTC);
  block_forward(host_model_ops(), out1.data(), kept.acts, params.data(), inp.data(), d);
  block_forward(host_model_ops(), out2.data(), ckpt.acts, params.data(), inp.data(), d);
  EXPECT_EQ(out1, out2);
  std::fill(ckpt.acts_mem.begin(), ckpt.acts_mem.end(), NAN);  // another layer used the scratch
  Vf dinp1(BTC), g1(P, 0.f), g2(P, 0.f), dx = dout;
  block_backward(host_model_ops(), dinp1.data(), g1.data(), dout.data(), kept.acts, params.data(), inp.data(), d,
                 kept.scratch.data(), false);
  block_backward(host_model_ops(), dx.data(), g2.data(), dx.data(), ckpt.acts, params.data(), inp.data(), d,
                 ckpt.scratch.data(), true);
  EXPECT_EQ(dinp1, dx);
  EXPECT_EQ(g1, g2);
}

// ---- tiny model: embed -> L blocks -> ln_f -> tied head -> cross-entropy --------------------

struct TinyModel {
  Gpt2Shape s{2, 2, 8, 11, 7};
  int B = 2, T = 5;
  BlockDims d{2, 5, 8, 2};
  std::vector<int32_t> tok = tokens(10, 11, 90), tgt = tokens(10, 11, 91);
  std::vector<Vd> units;  // one flat buffer per unit
  TinyModel() {
    for (int u = 0; u < num_units(s); u++) units.push_back(rnd(unit_numel(s, u), 92 + u, -0.5, 0.5));
  }
  int64_t BTC() const { return int64_t{B} * T * s.n_embd; }
};

// float64 loss of the tiny model; with grads non-null, also its gradient (+=) per unit.
double ref_model(TinyModel& m, std::vector<Vd>* grads) {
  const int C = m.s.n_embd, V = m.s.vocab_size, L = m.s.n_layer, N = m.B * m.T;
  const double* wte = m.units[0].data();
  const double* wpe = wte + int64_t{V} * C;
  std::vector<Vd> x(L + 1, Vd(m.BTC()));
  ref::encoder_forward(x[0].data(), m.tok.data(), wte, wpe, m.B, m.T, C);
  std::vector<RefBlock> blocks(L, RefBlock(m.d));
  for (int l = 0; l < L; l++) blocks[l].forward(x[l + 1].data(), m.units[1 + l].data(), x[l].data());
  const double* lnf_w = m.units[L + 1].data();
  Vd lnf(m.BTC()), mean(N), rstd(N), logits(int64_t{N} * V), dlogits(logits.size());
  ref::layernorm_forward(lnf.data(), mean.data(), rstd.data(), x[L].data(), lnf_w, lnf_w + C, N, C);
  ref::matmul_forward<double>(logits.data(), lnf.data(), wte, nullptr, N, C, V, true);
  double loss = ref::crossentropy_forward_backward(grads ? dlogits.data() : nullptr, logits.data(),
                                                   m.tgt.data(), N, V, 1.0 / N);
  if (!grads) return loss;
  auto& g = *grads;
  Vd dlnf(m.BTC()), dx(m.BTC());
  ref::matmul_backward<double>(dlnf.data(), g[0].data(), nullptr, dlogits.data(), lnf.data(), wte,
                               N, C, V, true);
  double* glnf = g[L + 1].data();
  ref::layernorm_backward(dx.data(), glnf, glnf + C, dlnf.data(), x[L].data(), lnf_w, mean.data(),
                          rstd.data(), N, C);
  for (int l = L - 1; l >= 0; l--) {
    Vd dprev(m.BTC());
    blocks[l].backward(dprev.data(), g[1 + l].data(), dx.data(), m.units[1 + l].data(),
                       x[l].data());
    dx = dprev;
  }
  ref::encoder_backward(g[0].data(), g[0].data() + int64_t{V} * C, dx.data(), m.tok.data(), m.B,
                        m.T, C);
  return loss;
}

TEST(Gpt2Model, ReferenceGradientMatchesFiniteDifferences) {
  TinyModel m;
  std::vector<Vd> g;
  for (auto& u : m.units) g.emplace_back(u.size(), 0.0);
  ref_model(m, &g);
  for (size_t u = 0; u < m.units.size(); u++)
    expect_fd(unit_name(m.s, u).c_str(), m.units[u], g[u], [&] { return ref_model(m, nullptr); });
}

// The fp32 path the engine will run: layer 0 keeps its activations, layer 1 is checkpointed.
TEST(Gpt2Model, Fp32MatchesReference) {
  TinyModel m;
  std::vector<Vd> g;
  for (auto& u : m.units) g.emplace_back(u.size(), 0.0);
  const double loss = ref_model(m, &g);

  const int C = m.s.n_embd, V = m.s.vocab_size, N = m.B * m.T;
  std::vector<Vf> p, gf;
  for (auto& u : m.units) p.push_back(to_f(u)), gf.emplace_back(u.size(), 0.f);
  const float* wte = p[0].data();
  std::vector<Vf> x(3, Vf(m.BTC()));
  encoder_forward(x[0].data(), m.tok.data(), wte, wte + V * C, m.B, m.T, C);
  BlockBuffers kept(m.d), shared(m.d);
  block_forward(host_model_ops(), x[1].data(), kept.acts, p[1].data(), x[0].data(), m.d);
  block_forward(host_model_ops(), x[2].data(), shared.acts, p[2].data(), x[1].data(), m.d);
  Vf lnf(m.BTC()), mean(N), rstd(N), logits(N * V), dlnf(m.BTC(), 0.f), dx(m.BTC(), 0.f);
  layernorm_forward(lnf.data(), mean.data(), rstd.data(), x[2].data(), p[3].data(), p[3].data() + C,
                    N, C);
  lm_head_forward(logits.data(), lnf.data(), wte, N, C, V);
  float lossf = crossentropy_forward_backward(logits.data(), nullptr, logits.data(), m.tgt.data(), N,
                                              V, 1.f / N);
  EXPECT_NEAR(lossf, loss, kFwdTol * loss);
  lm_head_backward(dlnf.data(), gf[0].data(), logits.data(), lnf.data(), wte, N, C, V);
  layernorm_backward(dx.data(), gf[3].data(), gf[3].data() + C, dlnf.data(), x[2].data(),
                     p[3].data(), mean.data(), rstd.data(), N, C);
  block_backward(host_model_ops(), dx.data(), gf[2].data(), dx.data(), shared.acts, p[2].data(), x[1].data(), m.d,
                 shared.scratch.data(), true);
  block_backward(host_model_ops(), dx.data(), gf[1].data(), dx.data(), kept.acts, p[1].data(), x[0].data(), m.d,
                 kept.scratch.data(), false);
  encoder_backward(gf[0].data(), gf[0].data() + V * C, dx.data(), m.tok.data(), m.B, m.T, C);
  for (size_t u = 0; u < g.size(); u++) EXPECT_LT(rel_err(gf[u], g[u]), kBwdTol) << u;
}

}  // namespace
}  // namespace zoe::gpt2

// bf16 compute (gpt2_ops.h): each product is the fp32 product of its operands rounded to bf16
// (to fp32 rounding), and a block computed that way stays within bf16's precision of the fp32
// block on the same (bf16) weights. Each test prints the GEMM path its bf16 products took.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/gemm.h"
#include "model/gpt2_block.h"
#include "ops/gpt2_ops.h"
#include "zoe/dtype.h"

namespace zoe::gpt2 {
namespace {

using Vf = std::vector<float>;
using Vh = std::vector<uint16_t>;

Vf rnd(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  Vf v(n);
  for (auto& x : v) x = u(g);
  return v;
}
Vh to_bf16(const Vf& v) {
  Vh h(v.size());
  for (size_t i = 0; i < v.size(); i++) h[i] = f32_to_bf16(v[i]);
  return h;
}
Vf widen(const Vh& h) {
  Vf v(h.size());
  for (size_t i = 0; i < h.size(); i++) v[i] = bf16_to_f32(h[i]);
  return v;
}
Vf rounded(const Vf& v) { return widen(to_bf16(v)); }

// max |got - want| / max |want|.
double rel_err(const Vf& got, const Vf& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); i++) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]));
    den = std::max(den, std::fabs(double(want[i])));
  }
  return num / den;
}

void say_path() {
  auto p = gemm_path(GemmType::kBF16);
  std::printf("bf16 products: %s (oneDNN finds %s)\n", p.ok() ? gemm_path_name(*p) : "?", gemm_onednn_isa().c_str());
}

constexpr double kSameProduct = 2e-6;  // another summation order of the same fp32 products
constexpr double kBf16 = 2e-2;         // bf16 (8 significant bits) against fp32

// got: want rounded to bf16, one bf16 step apart at most (the two products may accumulate in
// another order, and a sum near a rounding tie then rounds the other way), and rarely so.
void expect_rounding_of(const Vh& got, const Vf& want) {
  const Vh want16 = to_bf16(want);
  ASSERT_EQ(got.size(), want16.size());
  int off_by_one = 0;
  for (size_t i = 0; i < got.size(); i++) {
    ASSERT_LE(std::abs(int(got[i]) - int(want16[i])), 1) << i;
    off_by_one += got[i] != want16[i];
  }
  EXPECT_LT(off_by_one, int(got.size() / 50) + 1);  // rare: not a systematic bias
}

// A linear layer: its input x is bf16, as its producer writes it; dout fp32, rounded into scratch.
void check_linear(int N, int C, int OC) {
  say_path();
  const Vf x = rnd(size_t(N) * C, 1), dout = rnd(size_t(N) * OC, 2), bias = rnd(OC, 3);
  const Vh W = to_bf16(rnd(size_t(C) * OC, 4, 0.2f)), x16 = to_bf16(x);
  const Vf Wf = widen(W), xr = rounded(x), doutr = rounded(dout);
  Vh scratch(size_t(N) * OC, 0xffff);  // NaN patterns: every read element is written first
  // Forward.
  Vf out(size_t(N) * OC), want(out.size()), exact(out.size());
  matmul_forward_bf16(out.data(), x16.data(), W.data(), bias.data(), N, C, OC);
  matmul_forward(want.data(), xr.data(), Wf.data(), bias.data(), N, C, OC);
  matmul_forward(exact.data(), x.data(), Wf.data(), bias.data(), N, C, OC);
  EXPECT_LT(rel_err(out, want), kSameProduct);
  EXPECT_LT(rel_err(out, exact), kBf16);
  // The bf16 output: the fp32 one rounded.
  Vh out16(out.size(), 0xffff);
  matmul_forward_bf16(out16.data(), x16.data(), W.data(), bias.data(), N, C, OC);
  expect_rounding_of(out16, out);
  // Backward, accumulating onto a start.
  const Vf dx0 = rnd(size_t(N) * C, 5), dW0 = rnd(size_t(C) * OC, 6), db0 = rnd(OC, 7);
  Vf dx = dx0, dW = dW0, db = db0, dx_want = dx0, dW_want = dW0, db_want = db0;
  matmul_backward_bf16(dx.data(), dW.data(), db.data(), dout.data(), x16.data(), W.data(), N, C, OC, scratch.data());
  matmul_backward(dx_want.data(), dW_want.data(), nullptr, doutr.data(), xr.data(), Wf.data(), N, C, OC);
  matmul_backward(nullptr, nullptr, db_want.data(), dout.data(), x.data(), Wf.data(), N, C, OC);  // fp32 dout
  EXPECT_LT(rel_err(dx, dx_want), kSameProduct);
  EXPECT_LT(rel_err(dW, dW_want), kSameProduct);
  EXPECT_EQ(db, db_want);
  // A null output is skipped; dW alone still rounds its operands.
  Vf dW2 = dW0;
  matmul_backward_bf16(nullptr, dW2.data(), nullptr, dout.data(), x16.data(), W.data(), N, C, OC, scratch.data());
  EXPECT_EQ(dW2, dW);
  // overwrite: dinp is the product alone, its old contents (NaN) never read; the fp32 path too.
  Vf over(dx.size(), NAN), want_over(dx.size(), 0.f), over32(dx.size(), NAN);
  matmul_backward_bf16(over.data(), nullptr, nullptr, dout.data(), x16.data(), W.data(), N, C, OC, scratch.data(), true);
  matmul_backward(want_over.data(), nullptr, nullptr, doutr.data(), xr.data(), Wf.data(), N, C, OC);
  EXPECT_LT(rel_err(over, want_over), kSameProduct);
  matmul_backward(over32.data(), nullptr, nullptr, doutr.data(), xr.data(), Wf.data(), N, C, OC, true);
  EXPECT_EQ(over32, want_over);
}

// The LM head: input and dlogits bf16 as ln_f and the loss write them, logits rounded; W is [V, C].
void check_lm_head(int N, int C, int V) {
  say_path();
  const Vh x16 = to_bf16(rnd(size_t(N) * C, 11)), W = to_bf16(rnd(size_t(V) * C, 12, 0.2f));
  const Vh dlogits16 = to_bf16(rnd(size_t(N) * V, 13));
  const Vf xr = widen(x16), Wf = widen(W), dlr = widen(dlogits16);
  Vh logits16(size_t(N) * V, 0xffff);
  Vf want(logits16.size());
  lm_head_forward_bf16(logits16.data(), x16.data(), W.data(), N, C, V);
  lm_head_forward(want.data(), xr.data(), Wf.data(), N, C, V);
  expect_rounding_of(logits16, want);
  // Backward, accumulating onto a start; a null output skipped.
  const Vf dx0 = rnd(size_t(N) * C, 14), dW0 = rnd(size_t(V) * C, 15);
  Vf dx = dx0, dW = dW0, dx_want = dx0, dW_want = dW0, dW2 = dW0;
  lm_head_backward_bf16(dx.data(), dW.data(), dlogits16.data(), x16.data(), W.data(), N, C, V);
  lm_head_backward(dx_want.data(), dW_want.data(), dlr.data(), xr.data(), Wf.data(), N, C, V);
  EXPECT_LT(rel_err(dx, dx_want), kSameProduct);
  EXPECT_LT(rel_err(dW, dW_want), kSameProduct);
  lm_head_backward_bf16(nullptr, dW2.data(), dlogits16.data(), x16.data(), W.data(), N, C, V);
  EXPECT_EQ(dW2, dW);
}

// gelu_backward with overwrite is the accumulation onto zeros, bitwise, never reading dinp.
TEST(Bf16Compute, GeluBackwardOverwriteIsTheSumOntoZeros) {
  const size_t n = 1003;
  const Vf x = rnd(n, 40, 4.f), dout = rnd(n, 41);
  Vf acc(n, 0.f), over(n, NAN);
  gelu_backward(acc.data(), x.data(), dout.data(), int64_t(n));
  gelu_backward(over.data(), x.data(), dout.data(), int64_t(n), true);
  EXPECT_EQ(over, acc);
}

TEST(Bf16Compute, MatmulIsTheFp32ProductOfItsRoundedOperands) {
  check_linear(37, 48, 96);
  check_linear(300, 64, 520);  // several 256-wide slices
}

TEST(Bf16Compute, LmHeadIsTheFp32ProductOfItsRoundedOperands) {
  check_lm_head(21, 32, 300);
  check_lm_head(300, 64, 1003);  // several slices, a width not of whole vectors
}

// The loss on bf16 logits is crossentropy's on them widened, bitwise, its gradient that one's
// rounded; forward only it leaves the logits alone, and in place it is the same.
TEST(Bf16Compute, CrossEntropyIsTheFp32LossOnTheWidenedLogits) {
  const int N = 9, V = 1003;
  const Vh logits16 = to_bf16(rnd(size_t(N) * V, 20, 6.f));
  std::vector<int32_t> targets(N);
  for (int r = 0; r < N; r++) targets[r] = (r * 397 + 11) % V;
  const float dscale = 3.f / N;
  Vf dl_want = widen(logits16);
  float loss_want = 0.f, loss = 0.f, loss_fwd = 0.f, loss_in_place = 0.f;
  crossentropy(&loss_want, dl_want.data(), dl_want.data(), targets.data(), N, V, dscale);
  Vh dl16(logits16.size(), 0xffff), in_place = logits16, untouched = logits16;
  crossentropy_bf16(&loss, dl16.data(), logits16.data(), targets.data(), N, V, dscale);
  EXPECT_EQ(loss, loss_want);
  EXPECT_EQ(dl16, to_bf16(dl_want));
  crossentropy_bf16(&loss_fwd, nullptr, untouched.data(), targets.data(), N, V, dscale);
  EXPECT_EQ(loss_fwd, loss_want);
  EXPECT_EQ(untouched, logits16);
  crossentropy_bf16(&loss_in_place, in_place.data(), in_place.data(), targets.data(), N, V, dscale);
  EXPECT_EQ(loss_in_place, loss_want);
  EXPECT_EQ(in_place, dl16);
}

// The vectorised rounding is f32_to_bf16 on every value: ties both ways, NaNs (kept quiet, sign
// and payload bits kept), infinities, denormals, and a tail shorter than a vector.
TEST(Bf16Compute, RoundingIsF32ToBf16OnEveryValue) {
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0x7f800001u, 0xffa12345u, 0x00000001u, 0x807fffffu, 0x80000000u,
                                0x7f7fffffu, 0x7f7f8000u, 0x00008000u, 0x00018000u};
  std::mt19937 g(9);
  for (int i = 0; i < 4000; i++) bits.push_back(g());
  bits.resize(bits.size() + 3, 0x3f80c000u);
  Vf x(bits.size());
  for (size_t i = 0; i < bits.size(); i++) std::memcpy(&x[i], &bits[i], 4);
  Vh got(x.size());
  round_to_bf16(got.data(), x.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(got[i], f32_to_bf16(x[i])) << std::hex << bits[i];
}

// bf16 attention (qkv in bf16, as c_attn's product writes it) against the fp32 kernel on the
// fp32 qkv: the output, the log-sum-exp, the gradient (written rounded) and c_attn's bias gradient
// summed from it each within bf16's precision; T past one 64-query block and not a multiple of
// it, two head sizes. dbias accumulates (overwrite: the same sums written), the same bits on one
// thread as on two, and dqkv does not depend on whether dbias is asked for.
void check_attention(int B, int T, int C, int NH) {
  say_path();
  const size_t n3 = size_t(B) * T * 3 * C, n = size_t(B) * T * C;
  const Vf qkv = rnd(n3, 20), dout = rnd(n, 21), db0 = rnd(3 * C, 22);
  const Vh qkv16 = to_bf16(qkv);
  Vh out(n);
  Vf lse(size_t(B) * NH * T), out_f(n), lse_f(lse.size());
  attention_forward_bf16(out.data(), lse.data(), qkv16.data(), B, T, C, NH);
  attention_forward(out_f.data(), lse_f.data(), qkv.data(), B, T, C, NH);
  EXPECT_LT(rel_err(widen(out), out_f), kBf16);
  EXPECT_LT(rel_err(lse, lse_f), kBf16);
  Vh dqkv(n3, 0xffff);
  Vf dqkv_f(n3, 0.f), db = db0;
  attention_backward_bf16(dqkv.data(), db.data(), dout.data(), out.data(), qkv16.data(), lse.data(), B, T, C, NH);
  attention_backward(dqkv_f.data(), dout.data(), out_f.data(), qkv.data(), lse_f.data(), B, T, C, NH);
  EXPECT_LT(rel_err(widen(dqkv), dqkv_f), kBf16);
  Vf sums(3 * C), added(3 * C);
  for (int c = 0; c < 3 * C; c++) {
    double s = 0;
    for (size_t r = 0; r < size_t(B) * T; r++) s += dqkv_f[r * 3 * C + c];
    sums[c] = float(s);
    added[c] = db[c] - db0[c];
  }
  EXPECT_LT(rel_err(added, sums), kBf16);
  Vh again(n3, 0xffff), no_bias(n3, 0xffff);
  Vf over(3 * C, NAN);
  {
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    attention_backward_bf16(again.data(), over.data(), dout.data(), out.data(), qkv16.data(), lse.data(), B, T, C,
                            NH, /*overwrite=*/true);
  }
  EXPECT_EQ(again, dqkv);
  for (int c = 0; c < 3 * C; c++) ASSERT_EQ(db[c], db0[c] + over[c]) << c;
  attention_backward_bf16(no_bias.data(), nullptr, dout.data(), out.data(), qkv16.data(), lse.data(), B, T, C, NH);
  EXPECT_EQ(no_bias, dqkv);
}

TEST(Bf16Compute, AttentionIsTheFp32AttentionToBf16Precision) {
  check_attention(2, 75, 32, 2);    // hs 16, a block and a tail
  check_attention(1, 130, 128, 2);  // hs 64, three blocks
}

// The producers of the linear layers' inputs write the fp32 op's output rounded to bf16: GELU
// bitwise; LayerNorm, whose row sums run in vector lanes, within an fp32 rounding of it before its
// own (rows of a width that is not a multiple of 16; an element count that leaves a tail).
TEST(Bf16Compute, ProducersWriteTheFp32OutputRounded) {
  const int N = 13, C = 45;
  const Vf x = rnd(size_t(N) * C, 30, 3.f), w = rnd(C, 31), b = rnd(C, 32);
  Vf ln(x.size()), mean(N), rstd(N), mean16(N), rstd16(N);
  Vh ln16(x.size(), 0xffff);
  layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_forward_bf16(ln16.data(), mean16.data(), rstd16.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_LT(rel_err(widen(ln16), ln), 1.0 / 256 + 1e-6);
  int off = 0;
  for (size_t i = 0; i < ln.size(); i++) off += ln16[i] != f32_to_bf16(ln[i]);
  EXPECT_LT(off, int(ln.size() / 50) + 1);  // rare: a value that lies next to a rounding boundary
  EXPECT_LT(rel_err(mean16, mean), 1e-6);
  EXPECT_LT(rel_err(rstd16, rstd), 1e-6);
  // GELU reads c_fc's output as its product rounded it.
  const Vh x16 = to_bf16(x);
  Vf g(x.size());
  Vh g16(x.size(), 0xffff), in_place = x16;
  gelu_forward(g.data(), widen(x16).data(), int64_t(x.size()));
  gelu_forward_bf16(g16.data(), x16.data(), int64_t(x.size()));
  EXPECT_EQ(g16, to_bf16(g));
  gelu_forward_bf16(in_place.data(), in_place.data(), int64_t(x.size()));
  EXPECT_EQ(in_place, g16);
}

// LayerNorm's backward in bf16 compute: layernorm_backward's gradients to fp32 rounding (its row
// sums in lanes), dw and db accumulated onto their starts, dinp WRITTEN as dres + the gradient
// (dres aliasing dinp: the accumulation; null: 0); with dinp16 set, dinp rounded (bitwise) and its
// column sums (to fp32 rounding). The same bits on one thread as on two. N: two 64-row chunks
// and a tail; C: 16-lane pieces and a tail.
TEST(Bf16Compute, LayerNormBackwardIsTheFp32OneToFp32Rounding) {
  const int N = 150, C = 45;
  const size_t n = size_t(N) * C;
  const Vf x = rnd(n, 70, 3.f), w = rnd(C, 71), b = rnd(C, 72), dout = rnd(n, 73);
  const Vf dres = rnd(n, 74), dw0 = rnd(C, 75), db0 = rnd(C, 76);
  Vf ln(n), mean(N), rstd(N);
  layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  Vf dx(n, NAN), dw = dw0, db = db0, dsum(C, NAN), dx_want = dres, dw_want = dw0, db_want = db0;
  Vh dx16(n, 0xffff);
  layernorm_backward_bf16(dx.data(), dx16.data(), dsum.data(), dw.data(), db.data(), dres.data(), dout.data(),
                          x.data(), w.data(), mean.data(), rstd.data(), N, C);
  layernorm_backward(dx_want.data(), dw_want.data(), db_want.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  auto minus = [](Vf a, const Vf& b) {
    for (size_t i = 0; i < a.size(); i++) a[i] -= b[i];
    return a;
  };
  EXPECT_LT(rel_err(minus(dx, dres), minus(dx_want, dres)), 1e-5);
  EXPECT_LT(rel_err(minus(dw, dw0), minus(dw_want, dw0)), 1e-5);
  EXPECT_LT(rel_err(minus(db, db0), minus(db_want, db0)), 1e-5);
  EXPECT_EQ(dx16, to_bf16(dx));
  Vf sums(C);
  for (int c = 0; c < C; c++) {
    double t = 0;
    for (int r = 0; r < N; r++) t += dx[size_t(r) * C + c];
    sums[c] = float(t);
  }
  EXPECT_LT(rel_err(dsum, sums), 1e-6);
  // dres aliasing dinp accumulates; a null dres is 0; one thread gives the same bits as two.
  Vf acc = dres, zero_res(n, NAN), dw1 = dw0, db1 = db0;
  layernorm_backward_bf16(acc.data(), nullptr, nullptr, nullptr, nullptr, acc.data(), dout.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  EXPECT_EQ(acc, dx);
  {
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    layernorm_backward_bf16(zero_res.data(), nullptr, nullptr, dw1.data(), db1.data(), nullptr, dout.data(), x.data(),
                            w.data(), mean.data(), rstd.data(), N, C);
  }
  EXPECT_EQ(dw1, dw);
  EXPECT_EQ(db1, db);
  EXPECT_LT(rel_err(zero_res, minus(dx_want, dres)), 1e-5);
}

// GELU's bf16 backward: the fp32 op's gradient on the widened input, rounded (bitwise), and the
// column sums of the unrounded gradient as dbias (to fp32 rounding: 64-row chunks, then in chunk
// order), accumulated or overwritten; the same bits on one thread as on two. N: two whole 64-row
// chunks and a tail; OC: a 256-wide piece and a tail that is no multiple of 8.
TEST(Bf16Compute, GeluBackwardRoundsTheFp32GradientAndSumsItsColumns) {
  const int N = 141, OC = 301;
  const size_t n = size_t(N) * OC;
  const Vh x16 = to_bf16(rnd(n, 50, 5.f));
  const Vf dout = rnd(n, 51), db0 = rnd(OC, 52);
  Vf g(n, NAN);
  gelu_backward(g.data(), widen(x16).data(), dout.data(), int64_t(n), /*overwrite=*/true);
  Vf sums(OC, 0.f);
  for (int o = 0; o < OC; o++) {
    double s = 0;
    for (int r = 0; r < N; r++) s += g[size_t(r) * OC + o];
    sums[o] = float(s);
  }
  Vh d16(n, 0xffff);
  Vf db(OC, NAN);
  gelu_backward_bf16(d16.data(), db.data(), x16.data(), dout.data(), N, OC, /*overwrite=*/true);
  EXPECT_EQ(d16, to_bf16(g));
  EXPECT_LT(rel_err(db, sums), 1e-6);
  Vf acc = db0, acc_want(OC);
  Vh d16_again(n, 0xffff);
  gelu_backward_bf16(d16_again.data(), acc.data(), x16.data(), dout.data(), N, OC);
  for (int o = 0; o < OC; o++) acc_want[o] = db0[o] + db[o];
  EXPECT_EQ(acc, acc_want);
  EXPECT_EQ(d16_again, d16);
  Vh no_bias(n, 0xffff);  // dbias null: the gradient alone
  gelu_backward_bf16(no_bias.data(), nullptr, x16.data(), dout.data(), N, OC);
  EXPECT_EQ(no_bias, d16);
  Vf one(OC, NAN);
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
    gelu_backward_bf16(no_bias.data(), one.data(), x16.data(), dout.data(), N, OC, true);
  }
  EXPECT_EQ(one, db);
}

// c_fc's products on the dout GELU's backward rounded: the products of the overload that rounds
// dout itself, bitwise, where dout is bf16 already (its rounding then changes nothing).
TEST(Bf16Compute, MatmulBackwardOnARoundedDoutIsTheSameProducts) {
  const int N = 70, C = 48, OC = 200;
  const Vh x16 = to_bf16(rnd(size_t(N) * C, 60)), W = to_bf16(rnd(size_t(C) * OC, 61, 0.5f));
  const Vh dout16 = to_bf16(rnd(size_t(N) * OC, 62));
  const Vf dout = widen(dout16), dx0 = rnd(size_t(N) * C, 63), dW0 = rnd(size_t(C) * OC, 64);
  Vh scratch(size_t(N) * OC);
  for (bool overwrite : {false, true}) {
    Vf dx = dx0, dW = dW0, dx_want = dx0, dW_want = dW0;
    matmul_backward_bf16(dx.data(), dW.data(), dout16.data(), x16.data(), W.data(), N, C, OC, overwrite);
    matmul_backward_bf16(dx_want.data(), dW_want.data(), nullptr, dout.data(), x16.data(), W.data(), N, C, OC,
                         scratch.data(), overwrite);
    EXPECT_EQ(dx, dx_want) << overwrite;
    EXPECT_EQ(dW, dW_want) << overwrite;
  }
}

// The CPU runs c_fc with its GELU, and c_proj's backward with GELU's, as the ops they stand for,
// bitwise; the backward's outputs are written (their NaN starts never read).
TEST(Bf16Compute, GeluWithItsProductIsTheTwoOps) {
  const int N = 70, C = 48, OC = 200;
  const Vh x16 = to_bf16(rnd(size_t(N) * C, 65)), W = to_bf16(rnd(size_t(C) * OC, 66, 0.5f));
  const Vf bias = rnd(OC, 67);
  Vh out(size_t(N) * OC), pre(out.size()), out_want(out.size()), pre_want(out.size());
  matmul_gelu_forward_bf16(out.data(), pre.data(), x16.data(), W.data(), bias.data(), N, C, OC);
  matmul_forward_bf16(pre_want.data(), x16.data(), W.data(), bias.data(), N, C, OC);
  gelu_forward_bf16(out_want.data(), pre_want.data(), int64_t(out.size()));
  EXPECT_EQ(pre, pre_want);
  EXPECT_EQ(out, out_want);
  // Backward through a product [N,OC] -> [N,C] on GELU(pre).
  const Vh dout = to_bf16(rnd(size_t(N) * C, 68)), W2 = to_bf16(rnd(size_t(OC) * C, 69, 0.5f));
  Vh dpre(pre.size(), 0xffff), dpre_want(pre.size());
  Vf db(OC, NAN), dW(W2.size(), NAN), scratch(pre.size(), NAN), db_want(OC), dW_want(W2.size()), dg(pre.size());
  matmul_gelu_backward_bf16(dpre.data(), db.data(), dW.data(), dout.data(), out.data(), W2.data(), pre.data(), N, OC,
                            C, scratch.data());
  matmul_backward_bf16(dg.data(), dW_want.data(), dout.data(), out.data(), W2.data(), N, OC, C, /*overwrite=*/true);
  gelu_backward_bf16(dpre_want.data(), db_want.data(), pre.data(), dg.data(), N, OC, /*overwrite=*/true);
  EXPECT_EQ(dpre, dpre_want);
  EXPECT_EQ(db, db_want);
  EXPECT_EQ(dW, dW_want);
}

TEST(Bf16Compute, EncoderAddsTheWidenedRows) {
  const int B = 2, T = 5, C = 8, V = 11;
  const Vh wte = to_bf16(rnd(size_t(V) * C, 10)), wpe = to_bf16(rnd(size_t(T) * C, 11));
  std::vector<int32_t> inp = {3, 0, 10, 3, 7, 1, 1, 9, 2, 5};
  Vf out(size_t(B) * T * C), want(out.size());
  encoder_forward_bf16(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  encoder_forward(want.data(), inp.data(), widen(wte).data(), widen(wpe).data(), B, T, C);
  EXPECT_EQ(out, want);
}

TEST(Bf16Compute, BlockVectorsAreTheUnitsNonMatrixTensors) {
  const int C = 8;
  const auto v = block_vectors(C);
  ASSERT_EQ(v.size(), 8u);
  int64_t total = 0;
  for (auto [off, n] : v) total += n;
  EXPECT_EQ(total, 13 * C);
  const Vf flat(block_numel(C));
  const auto t = block_tensors(flat.data(), C);
  const float* want[] = {t.ln1_w, t.ln1_b, t.qkv_b, t.attproj_b, t.ln2_w, t.ln2_b, t.fc_b, t.fcproj_b};
  for (int i = 0; i < 8; i++) EXPECT_EQ(v[i].first, want[i] - flat.data()) << i;
}

// A block on bf16 weights: bf16 compute against fp32 compute on the same weights widened.
TEST(Bf16Compute, BlockIsTheFp32BlockToBf16Precision) {
  say_path();
  const BlockDims d{2, 17, 32, 4};
  const int64_t BTC = int64_t{d.B} * d.T * d.C, P = block_numel(d.C);
  Vf params = rnd(P, 20, 0.2f);
  for (int64_t i = 0; i < d.C; i++) params[i] = 1.f + params[i];  // ln1_w near 1
  const Vh unit = to_bf16(params);
  const Vf unit_f = widen(unit), inp = rnd(BTC, 21, 2.f), dout = rnd(BTC, 22);
  Vf packed;
  for (auto [off, n] : block_vectors(d.C)) packed.insert(packed.end(), unit_f.begin() + off, unit_f.begin() + off + n);
  Vh scratch(block_bf16_scratch_numel(d), 0xffff);
  const BlockWeights w{packed.data(), unit.data(), scratch.data()};

  BlockBuffers b16(d, /*bf16=*/true), b32(d);
  EXPECT_LT(b16.acts_mem.size(), b32.acts_mem.size() * 4 / 5) << "bf16 compute keeps four activations in bf16";
  Vf out(BTC), want(BTC);
  block_forward(host_model_ops(), out.data(), b16.acts, w, inp.data(), d);
  block_forward(host_model_ops(), want.data(), b32.acts, unit_f.data(), inp.data(), d);
  EXPECT_LT(rel_err(out, want), kBf16);
  EXPECT_GT(rel_err(out, want), 0.0) << "the bf16 products rounded nothing";

  Vf dinp(BTC), g(P, 0.f), dinp_want(BTC), g_want(P, 0.f);
  block_backward(host_model_ops(), dinp.data(), g.data(), dout.data(), b16.acts, w, inp.data(), d,
                 b16.scratch.data(), false);
  block_backward(host_model_ops(), dinp_want.data(), g_want.data(), dout.data(), b32.acts, unit_f.data(),
                 inp.data(), d, b32.scratch.data(), false);
  EXPECT_LT(rel_err(dinp, dinp_want), kBf16);
  EXPECT_LT(rel_err(g, g_want), kBf16);

  // Every gradient of the unit is overwritten (its caller zeroes nothing first): a buffer of NaNs
  // gives bitwise the zeroed one's, in both computes.
  Vf dinp_nan(BTC), g_nan(P, NAN), g_want_nan(P, NAN);
  block_backward(host_model_ops(), dinp_nan.data(), g_nan.data(), dout.data(), b16.acts, w, inp.data(), d,
                 b16.scratch.data(), false);
  block_backward(host_model_ops(), dinp_nan.data(), g_want_nan.data(), dout.data(), b32.acts, unit_f.data(),
                 inp.data(), d, b32.scratch.data(), false);
  for (int64_t i = 0; i < P; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(g_nan[i]), std::bit_cast<uint32_t>(g[i])) << "bf16 " << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(g_want_nan[i]), std::bit_cast<uint32_t>(g_want[i])) << "fp32 " << i;
  }

  // The residual's gradient handed over rounded, in the scratch with its column sums (as the
  // LayerNorm backward above leaves it): the same gradients to fp32 rounding (the projection's
  // bias then summed in chunks), and dinp left the same way for the block below, bitwise its
  // rounding, its sums to fp32 rounding.
  auto column_sums = [&](const Vf& x) {
    Vf sums(d.C);
    for (int c = 0; c < d.C; c++) {
      double t = 0;
      for (int64_t r = 0; r < BTC / d.C; r++) t += x[r * d.C + c];
      sums[c] = float(t);
    }
    return sums;
  };
  Vh handed(scratch.size(), 0xffff);
  const Vh dout16 = to_bf16(dout);
  std::copy(dout16.begin(), dout16.end(), handed.begin());
  Vf sums = column_sums(dout), dinp3(BTC), g3(P, NAN);
  const BlockWeights w_handed{packed.data(), unit.data(), handed.data()};
  block_backward(host_model_ops(), dinp3.data(), g3.data(), dout.data(), b16.acts, w_handed, inp.data(), d,
                 b16.scratch.data(), false, RoundedGrad{true, sums.data()}, RoundedGrad{true, sums.data()});
  EXPECT_LT(rel_err(dinp3, dinp), 1e-5);
  EXPECT_LT(rel_err(g3, g), 1e-5);
  EXPECT_EQ(Vh(handed.begin(), handed.begin() + BTC), to_bf16(dinp3));
  EXPECT_LT(rel_err(sums, column_sums(dinp3)), 1e-5);

  // Recompute (activation checkpointing) gives bitwise the kept activations' gradients.
  Vf dinp2(BTC), g2(P, 0.f);
  BlockBuffers again(d, /*bf16=*/true);
  std::fill(again.acts_mem.begin(), again.acts_mem.end(), NAN);
  block_backward(host_model_ops(), dinp2.data(), g2.data(), dout.data(), again.acts, w, inp.data(), d,
                 again.scratch.data(), true);
  EXPECT_EQ(dinp2, dinp);
  EXPECT_EQ(g2, g);
}

}  // namespace
}  // namespace zoe::gpt2

// The host GEMM paths (kernels/gemm.h) against the reference loops, and the bf16 paths against
// the fp32 reference to bf16's precision. Each case says which path ran; a path this CPU or build
// lacks is skipped with the reason.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm.h"
#include "zoe/dtype.h"

namespace zoe {
namespace {

struct Case {
  GemmShape s;
  float beta;
};

// Shapes as the model slices them (256-wide, both transposes, row strides wider than the
// matrix), odd sizes, and an empty one.
std::vector<Case> cases() {
  std::vector<Case> v;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 1.f, 0.5f}) {
        GemmShape s;
        s.ta = ta, s.tb = tb, s.M = 37, s.N = 256, s.K = 67;
        s.lda = (ta ? s.M : s.K) + 3;
        s.ldb = (tb ? s.K : s.N) + 5;
        s.ldc = s.N + 7;
        v.push_back({s, beta});
      }
  GemmShape big{false, false, 128, 96, 384, 384, 96, 96};
  v.push_back({big, 1.f});
  GemmShape empty{false, false, 0, 8, 8, 8, 8, 8};
  v.push_back({empty, 0.f});
  return v;
}

struct Data {
  std::vector<float> a, b, c;
  std::vector<uint16_t> a16, b16;
  // The operands as a product of type t reads them.
  const void* A(GemmType t) const { return t == GemmType::kF32 ? static_cast<const void*>(a.data()) : a16.data(); }
  const void* B(GemmType t) const { return t == GemmType::kF32 ? static_cast<const void*>(b.data()) : b16.data(); }
};

// A bias of N values, the same in every test that adds one.
std::vector<float> test_bias(int N) {
  std::vector<float> bias(N);
  for (int j = 0; j < N; ++j) bias[j] = 0.25f * float(j % 7) - 0.5f;
  return bias;
}

Data make_data(const GemmShape& s, uint32_t seed, bool bf16_exact) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  Data x;
  size_t a_rows = s.ta ? s.K : s.M, b_rows = s.tb ? s.N : s.K;
  x.a.resize(a_rows * s.lda + 1);
  x.b.resize(b_rows * s.ldb + 1);
  x.c.resize(size_t(s.M) * s.ldc + 1);
  for (auto& v : x.a) v = d(g);
  for (auto& v : x.b) v = d(g);
  for (auto& v : x.c) v = d(g);
  for (auto& v : x.a) x.a16.push_back(f32_to_bf16(v));
  for (auto& v : x.b) x.b16.push_back(f32_to_bf16(v));
  if (bf16_exact) {  // inputs a bf16 product sees exactly
    for (size_t i = 0; i < x.a.size(); ++i) x.a[i] = bf16_to_f32(x.a16[i]);
    for (size_t i = 0; i < x.b.size(); ++i) x.b[i] = bf16_to_f32(x.b16[i]);
  }
  return x;
}

// |got - want| <= tol * sum_k |a_ik b_kj| (+ |beta c|): the scale a sum's rounding has.
void expect_close(const GemmShape& s, const Data& x, float beta, const std::vector<float>& c0,
                  const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  int bad = 0;
  for (int i = 0; i < s.M; ++i)
    for (int j = 0; j < s.N; ++j) {
      double mag = std::fabs(beta * c0[size_t(i) * s.ldc + j]);
      for (int k = 0; k < s.K; ++k)
        mag += std::fabs(x.a[s.ta ? size_t(k) * s.lda + i : size_t(i) * s.lda + k] *
                         x.b[s.tb ? size_t(j) * s.ldb + k : size_t(k) * s.ldb + j]);
      size_t at = size_t(i) * s.ldc + j;
      if (!(std::fabs(got[at] - want[at]) <= tol * mag) && bad++ < 3)
        ADD_FAILURE() << what << " C[" << i << "," << j << "] = " << got[at] << ", reference " << want[at];
    }
  // Between rows (the stride's gap) nothing is written.
  for (int i = 0; i < s.M; ++i)
    for (int j = s.N; j < s.ldc && size_t(i) * s.ldc + j < got.size(); ++j)
      ASSERT_EQ(got[size_t(i) * s.ldc + j], c0[size_t(i) * s.ldc + j]) << what << " wrote past row " << i;
}

class GemmPaths : public ::testing::TestWithParam<GemmPath> {};

TEST_P(GemmPaths, Fp32MatchesTheReference) {
  GemmPath p = GetParam();
  if (!gemm_supported(p, GemmType::kF32)) GTEST_SKIP() << gemm_path_name(p) << ": not in this build";
  std::printf("fp32 through %s (oneDNN finds %s)\n", gemm_path_name(p), gemm_onednn_isa().c_str());
  for (const Case& k : cases()) {
    Data x = make_data(k.s, 1, false);
    std::vector<float> want = x.c, got = x.c;
    ASSERT_TRUE(gemm(GemmPath::kReference, GemmType::kF32, k.s, x.a.data(), x.b.data(), k.beta, want.data()).ok());
    ASSERT_TRUE(gemm(p, GemmType::kF32, k.s, x.a.data(), x.b.data(), k.beta, got.data()).ok());
    expect_close(k.s, x, k.beta, x.c, got, want, 1e-5, gemm_path_name(p));
  }
}

TEST_P(GemmPaths, Bf16MatchesTheReferenceAndFp32ToBf16Precision) {
  GemmPath p = GetParam();
  if (!gemm_supported(p, GemmType::kBF16))
    GTEST_SKIP() << "no bf16 GEMM through " << gemm_path_name(p) << " here (oneDNN finds " << gemm_onednn_isa()
                 << "; it needs AVX512-BF16 or AMX)";
  std::printf("bf16 through %s (oneDNN finds %s)\n", gemm_path_name(p), gemm_onednn_isa().c_str());
  for (const Case& k : cases()) {
    Data exact = make_data(k.s, 2, true), full = make_data(k.s, 2, false);
    std::vector<float> want = exact.c, got = exact.c, f32 = full.c;
    ASSERT_TRUE(gemm(GemmPath::kReference, GemmType::kF32, k.s, exact.a.data(), exact.b.data(), k.beta, want.data()).ok());
    ASSERT_TRUE(gemm(p, GemmType::kBF16, k.s, exact.a16.data(), exact.b16.data(), k.beta, got.data()).ok());
    expect_close(k.s, exact, k.beta, exact.c, got, want, 1e-5, "bf16 vs the reference on the same inputs");
    // Against fp32 inputs the difference is the inputs' rounding: 2^-8 relative each, two of them.
    ASSERT_TRUE(gemm(GemmPath::kReference, GemmType::kF32, k.s, full.a.data(), full.b.data(), k.beta, f32.data()).ok());
    std::vector<float> got_full = full.c;
    ASSERT_TRUE(gemm(p, GemmType::kBF16, k.s, full.a16.data(), full.b16.data(), k.beta, got_full.data()).ok());
    expect_close(k.s, full, k.beta, full.c, got_full, f32, 2.0 / 256 + 1e-5, "bf16 vs fp32");
  }
}

TEST_P(GemmPaths, BetaZeroNeverReadsC) {
  GemmPath p = GetParam();
  for (GemmType t : {GemmType::kF32, GemmType::kBF16}) {
    if (!gemm_supported(p, t)) continue;
    GemmShape s{false, true, 8, 16, 32, 32, 32, 16};
    Data x = make_data(s, 3, true);
    std::vector<float> c(x.c.size(), std::numeric_limits<float>::quiet_NaN());
    const void* a = x.A(t);
    const void* b = x.B(t);
    ASSERT_TRUE(gemm(p, t, s, a, b, 0.f, c.data()).ok());
    for (int i = 0; i < s.M * s.N; ++i) ASSERT_TRUE(std::isfinite(c[i])) << gemm_path_name(p) << " " << gemm_type_name(t);
  }
}

// Sliced over oneTBB's workers: the reference's result, and bitwise the same on 1 and 2 threads.
TEST_P(GemmPaths, SlicedProductsMatchAndDoNotDependOnTheThreadCount) {
  GemmPath p = GetParam();
  for (GemmType t : {GemmType::kF32, GemmType::kBF16}) {
    if (!gemm_supported(p, t)) continue;
    for (GemmShape s : {GemmShape{false, true, 40, 700, 33, 33, 33, 700}, GemmShape{true, false, 600, 70, 31, 600, 70, 70}}) {
      Data x = make_data(s, 4, true);
      const void* a = x.A(t);
      const void* b = x.B(t);
      std::vector<float> want = x.c, one = x.c, two = x.c;
      ASSERT_TRUE(gemm(GemmPath::kReference, GemmType::kF32, s, x.a.data(), x.b.data(), 1.f, want.data()).ok());
      {
        tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
        ASSERT_TRUE(gemm_sliced(p, t, s, a, b, 1.f, one.data()).ok());
      }
      {
        tbb::global_control c(tbb::global_control::max_allowed_parallelism, 2);
        ASSERT_TRUE(gemm_sliced(p, t, s, a, b, 1.f, two.data()).ok());
      }
      expect_close(s, x, 1.f, x.c, one, want, 1e-5, gemm_path_name(p));
      ASSERT_EQ(one, two) << gemm_path_name(p) << " " << gemm_type_name(t) << ": the thread count changed a result";
    }
  }
}

// The whole product on the library's own threads (zoe bench gemm's baseline): the reference's
// result on 1, 2 and 3 threads.
TEST_P(GemmPaths, ThreadedProductsMatchTheReference) {
  GemmPath p = GetParam();
  for (GemmType t : {GemmType::kF32, GemmType::kBF16}) {
    if (!gemm_supported(p, t)) continue;
    for (GemmShape s : {GemmShape{false, true, 40, 700, 33, 33, 33, 700}, GemmShape{true, false, 600, 70, 31, 600, 70, 70}}) {
      Data x = make_data(s, 6, true);
      std::vector<float> want = x.c;
      ASSERT_TRUE(gemm(GemmPath::kReference, GemmType::kF32, s, x.a.data(), x.b.data(), 1.f, want.data()).ok());
      for (int threads : {1, 2, 3}) {
        std::vector<float> got = x.c;
        ASSERT_TRUE(gemm_threaded(p, t, s, x.A(t), x.B(t), 1.f, got.data(), threads).ok());
        expect_close(s, x, 1.f, x.c, got, want, 1e-5, (std::string(gemm_path_name(p)) + " threaded").c_str());
      }
    }
  }
}

// A bias is added to every row, sliced or not, at beta 0 (C never read) and 1: the reference's
// product onto C seeded with beta C + bias, within fp32 rounding.
TEST_P(GemmPaths, BiasIsAddedToEveryRow) {
  GemmPath p = GetParam();
  for (GemmType t : {GemmType::kF32, GemmType::kBF16}) {
    if (!gemm_supported(p, t)) continue;
    for (GemmShape s : {GemmShape{false, false, 37, 300, 20, 20, 300, 301}, GemmShape{true, false, 600, 40, 9, 600, 40, 40}}) {
      for (float beta : {0.f, 1.f}) {
        Data x = make_data(s, 5, true);
        const std::vector<float> bias = test_bias(s.N);
        const void* a = x.A(t);
        const void* b = x.B(t);
        std::vector<float> want = x.c, got = x.c, sliced = x.c;
        if (beta == 0.f) std::fill(got.begin(), got.end() - 1, std::numeric_limits<float>::quiet_NaN());
        for (int i = 0; i < s.M; ++i)
          for (int j = 0; j < s.N; ++j) want[size_t(i) * s.ldc + j] = bias[j] + beta * want[size_t(i) * s.ldc + j];
        for (int i = 0; i < s.M; ++i)  // the gaps between rows as the paths leave them
          for (int j = s.N; j < s.ldc; ++j) got[size_t(i) * s.ldc + j] = sliced[size_t(i) * s.ldc + j] = x.c[size_t(i) * s.ldc + j];
        ASSERT_TRUE(gemm(GemmPath::kReference, GemmType::kF32, s, x.a.data(), x.b.data(), 1.f, want.data()).ok());
        ASSERT_TRUE(gemm(p, t, s, a, b, beta, got.data(), bias.data()).ok());
        ASSERT_TRUE(gemm_sliced(p, t, s, a, b, beta, sliced.data(), bias.data()).ok());
        const std::string what = std::string(gemm_path_name(p)) + " " + gemm_type_name(t) + " beta " + std::to_string(beta);
        expect_close(s, x, 1.f, x.c, got, want, 1e-5, what.c_str());
        expect_close(s, x, 1.f, x.c, sliced, want, 1e-5, (what + " sliced").c_str());
      }
    }
  }
}

// C in bf16: the path's own fp32 result (bias included) rounded, whole or sliced. oneDNN writes
// it from its accumulators for bf16 operands, possibly in another order than its fp32-output
// kernel: one bf16 step apart at most there, bitwise where the fp32 result is rounded.
TEST_P(GemmPaths, Bf16OutputIsTheFp32ResultRounded) {
  GemmPath p = GetParam();
  for (GemmType t : {GemmType::kF32, GemmType::kBF16}) {
    if (!gemm_supported(p, t)) continue;
    for (GemmShape s : {GemmShape{false, false, 37, 300, 20, 20, 300, 301}, GemmShape{true, true, 600, 40, 9, 600, 9, 41}}) {
      Data x = make_data(s, 6, true);
      const std::vector<float> bias = test_bias(s.N);
      const void* a = x.A(t);
      const void* b = x.B(t);
      std::vector<float> f(size_t(s.M) * s.ldc);
      ASSERT_TRUE(gemm(p, t, s, a, b, 0.f, f.data(), bias.data()).ok());
      for (bool sliced : {false, true}) {
        std::vector<uint16_t> c(f.size(), 0x7fc1);  // a NaN pattern: the gaps between rows stay so
        Status st = sliced ? gemm_sliced(p, t, s, a, b, c.data(), bias.data()) : gemm(p, t, s, a, b, c.data(), bias.data());
        ASSERT_TRUE(st.ok()) << st.message();
        const int tol = p == GemmPath::kOneDnn && t == GemmType::kBF16 ? 1 : 0;
        for (int i = 0; i < s.M; ++i)
          for (int j = 0; j < s.ldc; ++j) {
            const size_t at = size_t(i) * s.ldc + j;
            if (j >= s.N) {
              ASSERT_EQ(c[at], 0x7fc1) << "gap written at " << i << "," << j;
              continue;
            }
            ASSERT_LE(std::abs(int(c[at]) - int(f32_to_bf16(f[at]))), tol)
                << gemm_path_name(p) << " " << gemm_type_name(t) << (sliced ? " sliced " : " ") << i << "," << j;
          }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, GemmPaths, ::testing::Values(GemmPath::kReference, GemmPath::kOpenBlas, GemmPath::kOneDnn),
                         [](const auto& i) { return std::string(gemm_path_name(i.param)); });

TEST(GemmPath, TheEnvironmentChoosesAndABadChoiceNamesItsVariable) {
  ASSERT_EQ(setenv("ZOE_GEMM_F32", "reference", 1), 0);
  EXPECT_EQ(*gemm_path(GemmType::kF32), GemmPath::kReference);
  ASSERT_EQ(setenv("ZOE_GEMM_F32", "cublas", 1), 0);
  auto bad = gemm_path(GemmType::kF32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ZOE_GEMM_F32"), std::string::npos) << bad.status().message();
  ASSERT_EQ(setenv("ZOE_GEMM_BF16", "onednn", 1), 0);
  auto onednn = gemm_path(GemmType::kBF16);
  if (gemm_supported(GemmPath::kOneDnn, GemmType::kBF16)) {
    EXPECT_EQ(*onednn, GemmPath::kOneDnn);
  } else {  // a path that cannot run here
    ASSERT_FALSE(onednn.ok());
    EXPECT_EQ(onednn.status().code(), Code::kUnsupported);
    EXPECT_NE(onednn.status().message().find("ZOE_GEMM_BF16"), std::string::npos);
  }
  unsetenv("ZOE_GEMM_F32");
  unsetenv("ZOE_GEMM_BF16");
  EXPECT_EQ(*gemm_path(GemmType::kF32), GemmPath::kOpenBlas);
  EXPECT_EQ(*gemm_path(GemmType::kBF16),
            gemm_supported(GemmPath::kOneDnn, GemmType::kBF16) ? GemmPath::kOneDnn : GemmPath::kOpenBlas);
}

}  // namespace
}  // namespace zoe

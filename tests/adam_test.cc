// Fused CPU Adam: every ISA path against a float64 reference and torch's golden values, the
// paths against each other bit for bit, non-finite gradients, and threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/adam.h"
#include "kernels/parallel_chunks.h"
#include "test_util.h"

namespace zoe {
namespace {

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
// Odd lengths around both vector widths (8, 16), the 64-element alignment, and 0 / 1.
constexpr size_t kLengths[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1001};
constexpr int kSteps = 5;
constexpr float kGradScale = 1.0f / 1024;  // gradients arrive loss-scaled by 1024

// One tensor's state in the layout adam_step takes. No param copy when param is empty.
struct Tensor {
  DType grad_dtype;
  std::optional<DType> param_dtype;
  std::vector<uint8_t> grad, out;
  std::vector<float> master, m, v;

  Tensor(size_t n, DType g, std::optional<DType> p, uint64_t seed) : grad_dtype(g), param_dtype(p) {
    grad.resize(n * dtype_size(g));
    if (p) out.resize(n * dtype_size(*p));
    master = test::random_floats(n, seed, -1.f, 1.f);
    m = test::random_floats(n, seed + 1, -0.01f, 0.01f);
    v = test::random_floats(n, seed + 2, 0.f, 1e-4f);
  }
  size_t n() const { return master.size(); }
  void set_grad(size_t i, float g) { store_from_f32(grad.data(), grad_dtype, i, g); }
  float grad_at(size_t i) const { return load_as_f32(grad.data(), grad_dtype, i); }
  void fill_grads(uint64_t seed) {
    std::vector<float> g = test::random_floats(n(), seed, -1024.f, 1024.f);
    for (size_t i = 0; i < n(); ++i) set_grad(i, g[i]);
  }
  AdamRange range() {
    AdamRange r;
    r.grad = grad.data();
    r.grad_dtype = grad_dtype;
    r.master = master.data();
    r.exp_avg = m.data();
    r.exp_avg_sq = v.data();
    r.param_out = param_dtype ? out.data() : nullptr;
    r.param_dtype = param_dtype.value_or(DType::kBF16);
    r.n = n();
    return r;
  }
  bool bitwise_equal(const Tensor& o) const {
    if (n() != o.n()) return false;
    if (n() == 0) return true;  // memcmp on the null data() of empty vectors is UB, even for 0 bytes
    return grad == o.grad && out == o.out &&
           std::memcmp(master.data(), o.master.data(), n() * 4) == 0 &&
           std::memcmp(m.data(), o.m.data(), n() * 4) == 0 &&
           std::memcmp(v.data(), o.v.data(), n() * 4) == 0;
  }
};

AdamHyper hyper(bool decoupled, int64_t step) {
  AdamHyper h;
  h.lr = 3e-3;
  h.beta1 = 0.85;
  h.beta2 = 0.995;
  h.eps = 1e-8;
  h.weight_decay = 0.05;
  h.decoupled = decoupled;
  h.step = step;
  h.grad_scale = kGradScale;
  return h;
}

// Relative error with an absolute floor: |got - want| <= rel * max(|want|, floor). The floor is
// the typical size of the quantity, so a value that cancels to near zero is judged against
// the size of its terms, not against itself.
::testing::AssertionResult near_rel(double got, double want, double rel, double floor) {
  const double err = std::fabs(got - want), scale = std::max(std::fabs(want), floor);
  if (err <= rel * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << " want " << want << " rel err "
                                       << err / scale << " > " << rel;
}

std::string describe(Isa isa, DType g, std::optional<DType> p, bool decoupled, size_t n) {
  return std::string(isa_name(isa)) + " grad=" + std::string(dtype_name(g)) +
         " param=" + (p ? std::string(dtype_name(*p)) : std::string("none")) +
         (decoupled ? " AdamW" : " Adam") + " n=" + std::to_string(n);
}

class AdamIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam()))
      GTEST_SKIP() << isa_name(GetParam()) << " path not tested: this CPU lacks the ISA";
  }
};

// The float32 kernel tracks a float64 reference run from the same start over several steps.
// Floors: master ~ 1 (weights), m ~ 0.1 (scaled grads are within +-1), v ~ 1e-3.
TEST_P(AdamIsa, MatchesFloat64Reference) {
  const Isa isa = GetParam();
  for (DType gd : kAllDTypes)
    for (std::optional<DType> pd : {std::optional<DType>(), std::optional(DType::kBF16), std::optional(DType::kF16)})
      for (bool decoupled : {true, false})
        for (size_t n : kLengths) {
          SCOPED_TRACE(describe(isa, gd, pd, decoupled, n));
          Tensor t(n, gd, pd, 100 + n);
          std::vector<double> rm(t.master.begin(), t.master.end()), rmo(t.m.begin(), t.m.end()),
              rv(t.v.begin(), t.v.end());
          for (int step = 1; step <= kSteps; ++step) {
            t.fill_grads(1000 * step + n);
            const AdamHyper h = hyper(decoupled, step);
            ASSERT_EQ(adam_step_range(h, t.range(), isa), 0u);
            for (size_t i = 0; i < n; ++i) adam_reference_f64(h, t.grad_at(i), rm[i], rmo[i], rv[i]);
          }
          for (size_t i = 0; i < n; ++i) {
            ASSERT_TRUE(near_rel(t.master[i], rm[i], 1e-6, 1.0)) << "master[" << i << "]";
            ASSERT_TRUE(near_rel(t.m[i], rmo[i], 1e-6, 0.1)) << "exp_avg[" << i << "]";
            ASSERT_TRUE(near_rel(t.v[i], rv[i], 1e-6, 1e-3)) << "exp_avg_sq[" << i << "]";
            if (pd) {  // the weight copy is the master rounded to nearest even, exactly
              uint8_t want[4];
              store_from_f32(want, *pd, 0, t.master[i]);
              ASSERT_EQ(std::memcmp(&t.out[i * dtype_size(*pd)], want, dtype_size(*pd)), 0) << "param[" << i << "]";
            }
          }
        }
}

// Gradients that are inf or NaN (as stored, or after grad_scale overflows) are counted, and
// those elements keep master, m, v and the weight copy bit for bit; the others are updated as
// if the bad ones were not there. 45 elements: the bad ones fall in the body and in the tail.
TEST_P(AdamIsa, NonFiniteGradientsKeepState) {
  const Isa isa = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType gd : kAllDTypes)
    for (std::optional<DType> pd : {std::optional<DType>(), std::optional(DType::kBF16), std::optional(DType::kF16)})
      for (bool decoupled : {true, false}) {
        SCOPED_TRACE(describe(isa, gd, pd, decoupled, 45));
        Tensor t(45, gd, pd, 7);
        t.fill_grads(8);
        std::vector<size_t> bad = {0, 9, 44};
        t.set_grad(0, inf);
        t.set_grad(9, -inf);
        t.set_grad(44, nan);
        AdamHyper h = hyper(decoupled, 3);
        if (gd != DType::kF16) {  // finite as stored, infinite once scaled
          t.set_grad(20, 3e38f);
          h.grad_scale = 4.0f;
          bad.push_back(20);
        }
        for (size_t i = 0; i < t.out.size(); ++i) t.out[i] = static_cast<uint8_t>(0xa5 ^ i);
        const Tensor before = t;
        EXPECT_EQ(adam_step_range(h, t.range(), isa), bad.size());
        for (size_t i = 0; i < t.n(); ++i) {
          const bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
          const size_t w = pd ? dtype_size(*pd) : 0;
          const bool same = std::bit_cast<uint32_t>(t.master[i]) == std::bit_cast<uint32_t>(before.master[i]) &&
                            std::bit_cast<uint32_t>(t.m[i]) == std::bit_cast<uint32_t>(before.m[i]) &&
                            std::bit_cast<uint32_t>(t.v[i]) == std::bit_cast<uint32_t>(before.v[i]) &&
                            (w == 0 || std::memcmp(&t.out[i * w], &before.out[i * w], w) == 0);
          if (is_bad) {
            EXPECT_TRUE(same) << "element " << i << " has a non-finite gradient but changed";
          } else {  // updated as if the bad elements were not there
            double p = before.master[i], m = before.m[i], v = before.v[i];
            adam_reference_f64(h, before.grad_at(i), p, m, v);
            EXPECT_TRUE(near_rel(t.master[i], p, 1e-6, 1.0)) << "master[" << i << "]";
            EXPECT_TRUE(near_rel(t.m[i], m, 1e-6, 0.1)) << "exp_avg[" << i << "]";
            EXPECT_TRUE(near_rel(t.v[i], v, 1e-6, 1e-3)) << "exp_avg_sq[" << i << "]";
          }
        }
        // And every path gives the scalar path's bits here too.
        Tensor scalar = before;
        EXPECT_EQ(adam_step_range(h, scalar.range(), Isa::kScalar), bad.size());
        EXPECT_TRUE(t.bitwise_equal(scalar));
      }
}

// Every ISA this CPU has gives the scalar path's bits: master, m, v and the weight copy, over
// several steps, every dtype pair, tails, with some non-finite gradients mixed in.
TEST_P(AdamIsa, BitwiseEqualToScalar) {
  const Isa isa = GetParam();
  for (DType gd : kAllDTypes)
    for (std::optional<DType> pd : {std::optional<DType>(), std::optional(DType::kF32), std::optional(DType::kBF16), std::optional(DType::kF16)})
      for (bool decoupled : {true, false})
        for (size_t n : kLengths) {
          SCOPED_TRACE(describe(isa, gd, pd, decoupled, n));
          Tensor a(n, gd, pd, 300 + n);
          for (int step = 1; step <= kSteps; ++step) {
            a.fill_grads(77 * step + n);
            if (n > 5 && step == 2) a.set_grad(n / 2, std::numeric_limits<float>::infinity());
            Tensor b = a;
            const AdamHyper h = hyper(decoupled, step);
            ASSERT_EQ(adam_step_range(h, a.range(), isa), adam_step_range(h, b.range(), Isa::kScalar));
            ASSERT_TRUE(a.bitwise_equal(b)) << "step " << step;
          }
        }
}

// The weight copy of special values: with lr = 0 and no decay the master stays, so the copy is
// exactly dtype.h's conversion of it. Subnormals, rounding ties, the fp16 overflow edge,
// infinities and many random bit patterns; every path gives the same bits.
TEST_P(AdamIsa, WeightCopyOfSpecialValues) {
  const Isa isa = GetParam();
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00400000,
                                0x3f808000, 0x3f818000, 0x3f80ffff, 0xbf808001, 0x7f7fffff,
                                0xff7fffff, 0x7f7f8000, 0x477fe000, 0x477ff000, 0x477fefff,
                                0xc77ff000, 0x38800000, 0x387fffff, 0x33800000, 0x33000000,
                                0x33000001, 0x3300c000, 0x7f800000, 0xff800000};
  std::mt19937 rng(5);
  while (bits.size() < 20011) {
    const uint32_t u = rng();
    if ((u & 0x7fffffffu) <= 0x7f800000u) bits.push_back(u);  // NaNs separately below
  }
  for (DType pd : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(describe(isa, DType::kF32, pd, true, bits.size()));
    Tensor t(bits.size(), DType::kF32, pd, 1);
    for (size_t i = 0; i < bits.size(); ++i) t.master[i] = std::bit_cast<float>(bits[i]);
    for (size_t i = 0; i < t.n(); ++i) t.set_grad(i, 0.0f);
    AdamHyper h = hyper(true, 1);
    h.lr = 0.0;
    h.weight_decay = 0.0;
    Tensor s = t;
    ASSERT_EQ(adam_step_range(h, t.range(), isa), 0u);
    ASSERT_EQ(adam_step_range(h, s.range(), Isa::kScalar), 0u);
    EXPECT_TRUE(t.bitwise_equal(s));
    const size_t w = dtype_size(pd);
    for (size_t i = 0; i < t.n(); ++i) {
      ASSERT_EQ(std::fabs(t.master[i]), std::fabs(std::bit_cast<float>(bits[i]))) << std::hex << bits[i];
      uint8_t want[4];
      store_from_f32(want, pd, 0, t.master[i]);
      ASSERT_EQ(std::memcmp(&t.out[i * w], want, w), 0) << "master bits 0x" << std::hex << bits[i];
    }
  }
  // NaN masters stay NaN and give a NaN copy (the payload is not promised).
  Tensor t(33, DType::kF32, DType::kBF16, 2);
  Tensor u(33, DType::kF32, DType::kF16, 2);
  for (size_t i = 0; i < 33; ++i) {
    t.master[i] = u.master[i] = std::bit_cast<float>(0x7fc00000u | static_cast<uint32_t>(rng() & 0x3fffff) | (i % 2 ? 0x80000000u : 0));
    t.set_grad(i, 0.5f);
    u.set_grad(i, 0.5f);
  }
  ASSERT_EQ(adam_step_range(hyper(true, 1), t.range(), isa), 0u);
  ASSERT_EQ(adam_step_range(hyper(true, 1), u.range(), isa), 0u);
  for (size_t i = 0; i < 33; ++i) {
    uint16_t b, f;
    std::memcpy(&b, &t.out[2 * i], 2);
    std::memcpy(&f, &u.out[2 * i], 2);
    EXPECT_TRUE(std::isnan(t.master[i]) && std::isnan(bf16_to_f32(b)) && std::isnan(f16_to_f32(f))) << i;
  }
}

// torch.optim.AdamW / Adam (tools/gen_adam_golden.py, torch 1.13, fp32, foreach=False) to 1e-6
// relative: floors as in MatchesFloat64Reference (grads here are ~0.5, so v ~ 0.25*(1-beta2)).
TEST_P(AdamIsa, MatchesTorchGolden) {
  const Isa isa = GetParam();
  std::ifstream f(std::string(ZOE_SOURCE_DIR) + "/tests/data/adam_golden.json");
  ASSERT_TRUE(f.good()) << "missing tests/data/adam_golden.json (tools/gen_adam_golden.py writes it)";
  const nlohmann::json g = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(g.is_discarded()) << "tests/data/adam_golden.json is not valid JSON";
  for (const auto& c : g["cases"]) {
    SCOPED_TRACE(c["optimizer"].get<std::string>() + " on " + isa_name(isa));
    const size_t tensors = c["initial_params"].size();
    for (size_t t = 0; t < tensors; ++t) {
      std::vector<float> master = c["initial_params"][t].get<std::vector<float>>();
      const size_t n = master.size();
      std::vector<float> m(n, 0.f), v(n, 0.f), grad(n);
      for (int step = 1; step <= g["steps"].get<int>(); ++step) {
        grad = c["grads"][step - 1][t].get<std::vector<float>>();
        AdamHyper h;
        h.lr = g["lr"].get<double>();
        h.beta1 = g["beta1"].get<double>();
        h.beta2 = g["beta2"].get<double>();
        h.eps = g["eps"].get<double>();
        h.weight_decay = g["weight_decay"].get<double>();
        h.decoupled = c["decoupled"].get<bool>();
        h.step = step;
        AdamRange r;
        r.grad = grad.data();
        r.grad_dtype = DType::kF32;
        r.master = master.data();
        r.exp_avg = m.data();
        r.exp_avg_sq = v.data();
        r.param_out = nullptr;  // fp32 training: master is the weight
        r.n = n;
        ASSERT_EQ(adam_step_range(h, r, isa), 0u);
      }
      const auto want_p = c["final_params"][t].get<std::vector<double>>();
      const auto want_m = c["final_exp_avg"][t].get<std::vector<double>>();
      const auto want_v = c["final_exp_avg_sq"][t].get<std::vector<double>>();
      for (size_t i = 0; i < n; ++i) {
        EXPECT_TRUE(near_rel(master[i], want_p[i], 1e-6, 1.0)) << "tensor " << t << " param[" << i << "]";
        EXPECT_TRUE(near_rel(m[i], want_m[i], 1e-6, 0.1)) << "tensor " << t << " exp_avg[" << i << "]";
        EXPECT_TRUE(near_rel(v[i], want_v[i], 1e-6, 1e-3)) << "tensor " << t << " exp_avg_sq[" << i << "]";
      }
    }
  }
}

// Large ranges with a 64-byte aligned weight copy take the streaming-store path of the vector
// kernels: same bits as the scalar path, including lanes skipped for non-finite gradients.
TEST_P(AdamIsa, StreamedWeightCopyEqualsScalar) {
  const Isa isa = GetParam();
  const size_t n = 2 * 64 * 1024 + 13;
  for (DType pd : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(describe(isa, DType::kBF16, pd, true, n));
    const size_t bytes = (n * dtype_size(pd) + 63) / 64 * 64;
    std::unique_ptr<uint8_t, decltype(&std::free)> a_out(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)), &std::free);
    std::unique_ptr<uint8_t, decltype(&std::free)> b_out(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)), &std::free);
    ASSERT_TRUE(a_out && b_out);
    std::memset(a_out.get(), 0x5a, bytes);
    std::memset(b_out.get(), 0x5a, bytes);
    Tensor a(n, DType::kBF16, pd, 21);
    a.fill_grads(22);
    for (size_t i = 100; i < n; i += 9973) a.set_grad(i, std::numeric_limits<float>::infinity());
    Tensor b = a;
    AdamRange ra = a.range(), rb = b.range();
    ra.param_out = a_out.get();
    rb.param_out = b_out.get();
    const AdamHyper h = hyper(true, 4);
    ASSERT_EQ(adam_step_range(h, ra, isa), adam_step_range(h, rb, Isa::kScalar));
    EXPECT_TRUE(a.bitwise_equal(b));
    EXPECT_EQ(std::memcmp(a_out.get(), b_out.get(), bytes), 0);
  }
}

// A speculative step taken back (AdamHyper::undo; zoe.update_in_backward when the global norm
// clips or overflows): from the stepped state and the same gradient the master, m and v come back
// within a few roundings (m and v exactly 0 after step 1), the lanes the step skipped keep their
// state, every lane's weight copy is its master's; stepped again at another scale, the state lands
// within roundings of stepping at that scale from the start.
TEST_P(AdamIsa, UndoTakesBackASpeculativeStep) {
  const Isa isa = GetParam();
  constexpr size_t n = 1001, kInf = 7, kNan = 500;
  for (bool decoupled : {true, false})
    for (int64_t step : {1, 3})
      for (DType gd : {DType::kBF16, DType::kF32}) {
        SCOPED_TRACE(describe(isa, gd, DType::kBF16, decoupled, n) + " step " + std::to_string(step));
        Tensor base(n, gd, DType::kBF16, 21);
        if (step == 1) std::fill(base.m.begin(), base.m.end(), 0.f), std::fill(base.v.begin(), base.v.end(), 0.f);
        base.fill_grads(22);
        base.set_grad(kInf, std::numeric_limits<float>::infinity());
        base.set_grad(kNan, std::numeric_limits<float>::quiet_NaN());
        const AdamHyper made = hyper(decoupled, step);
        Tensor stepped = base;
        ASSERT_EQ(adam_step_range(made, stepped.range(), isa), 2u);

        AdamHyper back = made;
        back.undo = true;
        back.undo_grad_scale = made.grad_scale;
        back.restore_only = true;
        Tensor restored = stepped;
        EXPECT_EQ(adam_step_range(back, restored.range(), isa), 2u);
        for (size_t i = 0; i < n; ++i) {
          uint8_t copy[2];  // every lane's weight copy is its (restored) master's
          store_from_f32(copy, DType::kBF16, 0, restored.master[i]);
          ASSERT_EQ(std::memcmp(restored.out.data() + 2 * i, copy, 2), 0) << "weight copy " << i;
          if (i == kInf || i == kNan) {
            EXPECT_EQ(restored.master[i], base.master[i]);
            EXPECT_EQ(restored.m[i], base.m[i]);
            EXPECT_EQ(restored.v[i], base.v[i]);
            continue;
          }
          ASSERT_TRUE(near_rel(restored.master[i], base.master[i], 1e-6, 1.0)) << "master " << i;
          ASSERT_TRUE(near_rel(restored.m[i], base.m[i], 1e-5, 0.01)) << "m " << i;
          ASSERT_TRUE(near_rel(restored.v[i], base.v[i], 1e-4, 1e-4)) << "v " << i;
          ASSERT_GE(restored.v[i], 0.f);
          if (step == 1) {
            ASSERT_TRUE(restored.m[i] == 0.f && restored.v[i] == 0.f) << i;
          }
        }

        AdamHyper again = back;
        again.restore_only = false;
        again.grad_scale = made.grad_scale / 4;
        Tensor redone = stepped;
        AdamHyper direct = made;
        direct.grad_scale = again.grad_scale;
        Tensor want = base;
        EXPECT_EQ(adam_step_range(again, redone.range(), isa), adam_step_range(direct, want.range(), isa));
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(near_rel(redone.master[i], want.master[i], 1e-6, 1.0)) << "master " << i;
          ASSERT_TRUE(near_rel(redone.m[i], want.m[i], 1e-5, 0.01)) << "m " << i;
          ASSERT_TRUE(near_rel(redone.v[i], want.v[i], 1e-4, 1e-4)) << "v " << i;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Isas, AdamIsa, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& p) { return std::string(isa_name(p.param)); });

// adam_step over threads (64-aligned static pieces) gives the single-thread range's bits and
// count, for every thread count, on a length that is no multiple of anything.
TEST(AdamThreads, ThreadedEqualsSingleThread) {
  const size_t n = 3 * kChunkElems + 77;
  for (DType gd : {DType::kBF16, DType::kF32})
    for (Isa isa : {best_isa(), Isa::kScalar}) {
      SCOPED_TRACE(describe(isa, gd, DType::kBF16, true, n));
      Tensor base(n, gd, DType::kBF16, 11);
      base.fill_grads(12);
      size_t nans = 0;
      for (size_t i = 5; i < n; i += n / 7, ++nans) base.set_grad(i, std::numeric_limits<float>::quiet_NaN());
      const AdamHyper h = hyper(true, 2);
      Tensor single = base;
      const size_t single_bad = adam_step_range(h, single.range(), isa);
      EXPECT_EQ(single_bad, nans);
      for (int threads : {1, 2, 3, 0}) {
        Tensor t = base;
        EXPECT_EQ(adam_step(h, t.range(), isa, threads), single_bad) << threads << " threads";
        EXPECT_TRUE(t.bitwise_equal(single)) << threads << " threads";
      }
    }
}

TEST(AdamDispatch, EmptyRangeAndIsaFallback) {
  EXPECT_EQ(adam_step_range(AdamHyper{}, AdamRange{}, best_isa()), 0u);  // n = 0, null pointers
  EXPECT_EQ(adam_step(AdamHyper{}, AdamRange{}, best_isa(), 2), 0u);
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  EXPECT_STREQ(isa_name(Isa::kAvx512), "avx512");
  if (isa_has_avx512bf16()) {
    EXPECT_TRUE(isa_supported(Isa::kAvx512));
  }
  // Asking for every ISA works on any CPU: a missing one falls back to a narrower one, and all
  // give the same bits.
  Tensor ref(101, DType::kBF16, DType::kBF16, 3);
  ref.fill_grads(4);
  Tensor s = ref;
  ASSERT_EQ(adam_step_range(hyper(false, 1), s.range(), Isa::kScalar), 0u);
  for (Isa isa : kAllIsas) {
    Tensor t = ref;
    EXPECT_EQ(adam_step_range(hyper(false, 1), t.range(), isa), 0u);
    EXPECT_TRUE(t.bitwise_equal(s)) << isa_name(isa);
  }
}

}  // namespace
}  // namespace zoe

// The CUDA kernels' element conversions and fp32 addition (gpu/dtype_bits.h), compiled for the
// host: bit for bit zoe/dtype.h's conversions over every 16-bit pattern and a sweep of fp32
// patterns (dense where the roundings turn), and add_x86 equal to this CPU's own addition,
// NaN payloads and the invalid-operation NaN included. The GPU runs the same source.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/dtype_bits.h"
#include "zoe/dtype.h"

namespace zoe::gpu {
namespace {

uint32_t u32(float f) { return bits::as_uint(f); }

TEST(DtypeBits, SixteenBitToF32ForEveryPattern) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    ASSERT_EQ(u32(bits::f16_to_f32(x)), u32(f16_to_f32(x))) << "fp16 0x" << std::hex << h;
    ASSERT_EQ(u32(bits::bf16_to_f32(x)), u32(bf16_to_f32(x))) << "bf16 0x" << std::hex << h;
  }
}

void check_f32(uint32_t u) {
  const float f = bits::as_float(u);
  ASSERT_EQ(bits::f32_to_f16(f), f32_to_f16(f)) << "to fp16 of 0x" << std::hex << u;
  ASSERT_EQ(bits::f32_to_bf16(f), f32_to_bf16(f)) << "to bf16 of 0x" << std::hex << u;
}

TEST(DtypeBits, F32ToSixteenBitOverASweep) {
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251) {
    check_f32(static_cast<uint32_t>(u));
    if (HasFatalFailure()) return;
  }
  // Every pattern near the places where the roundings change: fp16's subnormal and overflow
  // boundaries and its smallest subnormal's tie, bf16's largest finite, infinity and the NaNs.
  const uint32_t centres[] = {0x33000000u, 0x33800000u, 0x38800000u, 0x387fe000u, 0x477fe000u, 0x477ff000u,
                              0x7f7f8000u, 0x7f800000u, 0x7fc00000u, 0x00000000u, 0x00800000u, 0x3f808000u};
  for (uint32_t c : centres)
    for (uint32_t sign : {0u, 0x80000000u})
      for (int64_t d = -70000; d <= 70000; ++d) {
        const int64_t u = static_cast<int64_t>(c) + d;
        if (u < 0 || u > 0x7fffffff) continue;
        check_f32(static_cast<uint32_t>(u) | sign);
        if (HasFatalFailure()) return;
      }
}

// Operands: NaNs with payloads (quiet and signalling, both signs), infinities, zeros,
// subnormals, the largest finite values and ordinary numbers.
std::vector<float> operands() {
  const uint32_t raw[] = {0x7fc00000u, 0xffc00000u, 0x7fa00001u, 0xffb12345u, 0x7fc54321u, 0x7f800001u,
                          0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                          0x7f7fffffu, 0xff7fffffu, 0x3f800000u, 0xbf800000u, 0x3f800001u, 0x4b800000u};
  std::vector<float> v;
  for (uint32_t r : raw) v.push_back(bits::as_float(r));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-100.f, 100.f);
  for (int i = 0; i < 40; ++i) v.push_back(d(rng));
  return v;
}

TEST(DtypeBits, AddX86IsThisCpusAddition) {
  const std::vector<float> ops = operands();
  int both_nan_same = 0, both_nan_total = 0;
  for (float a : ops)
    for (float b : ops) {
      volatile float va = a, vb = b;  // the hardware adds, not the compiler's constant folding
      const float cpu = va + vb;
      const float gpu_rule = bits::add_x86(a, b);
      if (bits::is_nan(a) && bits::is_nan(b)) {  // which NaN wins depends on the operand order
        ++both_nan_total;                        // the compiler chose: counted, not asserted
        both_nan_same += u32(cpu) == u32(gpu_rule);
        continue;
      }
      ASSERT_EQ(u32(gpu_rule), u32(cpu)) << std::hex << "0x" << u32(a) << " + 0x" << u32(b);
    }
  std::printf("both operands NaN: the CPU's result is add_x86's in %d of %d cases\n", both_nan_same, both_nan_total);
  // The cases the kernels rely on, spelled out.
  EXPECT_EQ(u32(bits::add_x86(bits::as_float(0x7f800000u), bits::as_float(0xff800000u))), 0xffc00000u);
  EXPECT_EQ(u32(bits::add_x86(bits::as_float(0x7fa00001u), 1.0f)), 0x7fe00001u);
  EXPECT_EQ(u32(bits::add_x86(1.0f, bits::as_float(0xffb12345u))), 0xfff12345u);
  EXPECT_EQ(u32(bits::add_x86(bits::as_float(0x7f7fffffu), bits::as_float(0x7f7fffffu))), 0x7f800000u);
}

}  // namespace
}  // namespace zoe::gpu

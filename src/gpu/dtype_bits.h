// zoe/dtype.h's conversions and the fp32 addition of the CUDA device's kernels, written once for
// the GPU (nvcc: round-to-nearest intrinsics) and the host (plain C++), so that a CPU unit test
// (tests/dtype_bits_test.cc) checks them bit for bit against zoe/dtype.h and against this CPU's
// own addition where no GPU is present.
//
// add_x86 is a + b with x86 SSE's NaN results, which the GPU's add does not give by itself (it
// returns one canonical NaN): a NaN operand comes back quieted (the first one when both are), an
// invalid sum (inf + -inf) is the default NaN 0xffc00000.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZOE_HD __host__ __device__ __forceinline__
#else
#define ZOE_HD inline
#endif

namespace zoe::gpu::bits {

ZOE_HD uint32_t as_uint(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

ZOE_HD float as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

ZOE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

ZOE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

ZOE_HD bool is_nan(float f) { return (as_uint(f) & 0x7fffffffu) > 0x7f800000u; }

// bf16: round to nearest even; NaN -> its top half with the quiet bit.
ZOE_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

ZOE_HD float bf16_to_f32(uint16_t h) { return as_float(static_cast<uint32_t>(h) << 16); }

// IEEE half, round to nearest even; every NaN -> sign | 0x7e00.
ZOE_HD uint16_t f32_to_f16(float f) {
  const uint32_t x = as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (ax < 0x38800000u) {  // subnormal half or zero: add magic to round at the right bit
    const float r = add_rn(as_float(ax), 0.5f);
    return static_cast<uint16_t>(sign | (as_uint(r) - 0x3f000000u));
  }
  const uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (ax >> 13));
}

// Exact; NaN payloads kept.
ZOE_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // mant * 2^-24, exact in fp32
    const float r = mul_rn(static_cast<float>(mant), 5.9604644775390625e-8f);
    return as_float(as_uint(r) | sign);
  }
  if (exp == 31) return as_float(sign | 0x7f800000u | (mant << 13));
  return as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

ZOE_HD float add_x86(float a, float b) {
  if (is_nan(a)) return as_float(as_uint(a) | 0x00400000u);
  if (is_nan(b)) return as_float(as_uint(b) | 0x00400000u);
  const float r = add_rn(a, b);
  return is_nan(r) ? as_float(0xffc00000u) : r;
}

}  // namespace zoe::gpu::bits

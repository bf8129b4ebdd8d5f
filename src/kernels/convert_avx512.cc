// The AVX-512 fp32 -> bf16 / fp16 conversion (see convert.h): sixteen elements a step, the tail
// under a mask. bf16 takes AVX512-BF16's vcvtneps2bf16 where the CPU has it (subnormal lanes fall
// back to the integer rounding, as in Adam): both give dtype.h's bits.
// Compiled with -mavx512f/bw/vl/dq/bf16 -mf16c; only the entry point has external linkage.
#if !defined(__clang__)  // GCC 12's AVX-512 headers (GCC bug 105593), as in adam_avx512.cc
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "kernels/convert.h"
#include "kernels/half_avx512.h"

namespace zoe {
namespace {

template <typename ToHalf>
void convert_range(uint16_t* dst, const float* src, size_t lo, size_t hi, ToHalf to_half) {
  size_t i = lo;
  for (; i + 16 <= hi; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), to_half(_mm512_loadu_ps(src + i)));
  if (i < hi) {
    const __mmask16 m = static_cast<__mmask16>((1u << (hi - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, m, to_half(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

}  // namespace

void convert_from_f32_avx512(DType dst_type, void* dst, const float* src, size_t lo, size_t hi) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dst_type == DType::kF16) return convert_range(d, src, lo, hi, [](__m512 x) { return to_f16(x); });
  if (isa_has_avx512bf16()) return convert_range(d, src, lo, hi, [](__m512 x) { return to_bf16_native(x); });
  convert_range(d, src, lo, hi, [](__m512 x) { return to_bf16(x); });
}

}  // namespace zoe

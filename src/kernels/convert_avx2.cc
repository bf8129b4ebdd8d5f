// The AVX2 fp32 -> bf16 / fp16 conversion (see convert.h), for CPUs without AVX-512 (Zen 3):
// eight elements a step; the tail goes through an 8-element buffer (no shared inline function
// may be called here: half_avx2.h). Compiled with -mavx2 -mf16c; only the entry point has
// external linkage.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/convert.h"
#include "kernels/half_avx2.h"

namespace zoe {
namespace {

template <typename ToHalf>
void convert_range(uint16_t* dst, const float* src, size_t lo, size_t hi, ToHalf to_half) {
  size_t i = lo;
  for (; i + 8 <= hi; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), to_half(_mm256_loadu_ps(src + i)));
  if (i < hi) {
    float in[8] = {};
    uint16_t out[8];
    std::memcpy(in, src + i, (hi - i) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), to_half(_mm256_loadu_ps(in)));
    std::memcpy(dst + i, out, (hi - i) * sizeof(uint16_t));
  }
}

}  // namespace

void convert_from_f32_avx2(DType dst_type, void* dst, const float* src, size_t lo, size_t hi) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (dst_type == DType::kF16) return convert_range(d, src, lo, hi, [](__m256 x) { return to_f16(x); });
  convert_range(d, src, lo, hi, [](__m256 x) { return to_bf16(x); });
}

}  // namespace zoe

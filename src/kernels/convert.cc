// The reference fp32 -> low-precision conversion (see convert.h) and the ISA choice.
#include "kernels/convert.h"

#include <cstdint>
#include <cstring>

namespace zoe {

void convert_from_f32_scalar(DType dst_type, void* dst, const float* src, size_t lo, size_t hi) {
  switch (dst_type) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(dst) + lo, src + lo, (hi - lo) * sizeof(float));
      return;
    case DType::kBF16:
      for (size_t i = lo; i < hi; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    case DType::kF16:
      for (size_t i = lo; i < hi; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
  }
}

void convert_from_f32(DType dst_type, void* dst, const float* src, size_t lo, size_t hi, Isa isa) {
  if (dst_type != DType::kF32 && isa == Isa::kAvx512 && isa_supported(Isa::kAvx512))
    return convert_from_f32_avx512(dst_type, dst, src, lo, hi);
  if (dst_type != DType::kF32 && isa >= Isa::kAvx2 && isa_supported(Isa::kAvx2))
    return convert_from_f32_avx2(dst_type, dst, src, lo, hi);
  convert_from_f32_scalar(dst_type, dst, src, lo, hi);
}

}  // namespace zoe

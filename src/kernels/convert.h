// fp32 -> bf16 / fp16 / fp32 over a flat range: elements [lo, hi) of src into the same elements of
// dst, rounded to nearest even as dtype.h's f32_to_bf16 / f32_to_f16 (NaNs quieted alike). The
// conversion behind every fp32 gradient handed to a low-precision shard: a plain loop built for
// any x86-64 runs at a quarter of the AVX-512 kernel's speed (bench/history.md, issue 49).
// Every ISA gives the same bits (tested on every float class).
#pragma once
#include <cstddef>

#include "kernels/adam.h"  // Isa
#include "zoe/dtype.h"

namespace zoe {

// With the given ISA (one the CPU lacks falls back to the reference).
void convert_from_f32(DType dst_type, void* dst, const float* src, size_t lo, size_t hi, Isa isa);

// The kernels behind it (convert.cc, convert_avx2.cc, convert_avx512.cc).
void convert_from_f32_scalar(DType dst_type, void* dst, const float* src, size_t lo, size_t hi);
void convert_from_f32_avx2(DType dst_type, void* dst, const float* src, size_t lo, size_t hi);
void convert_from_f32_avx512(DType dst_type, void* dst, const float* src, size_t lo, size_t hi);

}  // namespace zoe

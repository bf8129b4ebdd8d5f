// Sums of squares in double, for the gradient norm: element i of [lo, hi) goes into running sum
// (i - lo) % 8 and the eight are added in a fixed order, so the result depends neither on the
// ISA nor on the thread count (threads take whole blocks), and the loop is not one chain of
// dependent adds. The AVX-512 kernel keeps the eight sums in one register, a multiply and an add
// each (never fused): bitwise the scalar reference.
#pragma once
#include <cstddef>

#include "kernels/adam.h"  // Isa
#include "zoe/dtype.h"

namespace zoe {

// Elements [lo, hi) of x (dtype dt), with the given ISA (one the CPU lacks falls back to scalar).
double sum_squares_range(DType dt, const void* x, size_t lo, size_t hi, Isa isa);

// The kernels behind it (sum_squares.cc, sum_squares_avx512.cc).
double sum_squares_scalar(DType dt, const void* x, size_t lo, size_t hi);
double sum_squares_avx512(DType dt, const void* x, size_t lo, size_t hi);

}  // namespace zoe

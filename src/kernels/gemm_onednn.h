// The oneDNN path of gemm.h (gemm_onednn.cc), or its absence (gemm_onednn_absent.cc) in a build
// without oneDNN (-DZOE_ONEDNN=OFF, or the library not found).
#pragma once
#include <string>

#include "kernels/gemm.h"

namespace zoe::onednn {

bool supported(bool bf16);
std::string isa();
// bias (N floats, or null): added to every row, as oneDNN's bias argument. C holds fp32, or bf16
// bit patterns where c_bf16 (the fp32 result rounded to nearest even; beta 0). threads: the
// OpenMP team oneDNN runs it on (1: the calling thread alone, as a slice of oneTBB's work).
Status matmul(bool bf16, const GemmShape& s, const void* A, const void* B, float beta, void* C, bool c_bf16,
              const float* bias, int threads = 1);

}  // namespace zoe::onednn

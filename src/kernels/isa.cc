// Run-time ISA selection for the CPU kernels.
#include "kernels/adam.h"

#include <cpuid.h>

namespace zoe {

namespace {

// clang 14's __builtin_cpu_supports does not know "f16c": ask CPUID leaf 1 (ECX bit 29). The
// AVX2 check beside it already covers the OS saving the YMM registers.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

bool isa_supported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case Isa::kAvx2:
      // The AVX2 kernel converts fp16 with F16C too.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    default: return true;
  }
}

bool isa_has_avx512bf16() {
  return isa_supported(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
}

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

}  // namespace zoe

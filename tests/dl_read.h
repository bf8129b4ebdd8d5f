// The values of a tensor zoe handed out (zoe_fetch), wherever it lives: host memory, or, in the
// C API's *_emu tests, device memory of the emulated GPU (read through libzoe_emu's cudaMemcpy).
#pragma once
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

#ifdef ZOE_CUDA_EMU
extern "C" int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind);  // cudaError_t, cudaMemcpyKind
#endif

namespace zoe::test {

inline std::vector<float> read_floats(const DLTensor& t, size_t n) {
  std::vector<float> v(n);
  const char* p = static_cast<const char*>(t.data) + t.byte_offset;
#ifdef ZOE_CUDA_EMU
  if (test_device_name() == "cuda") {
    EXPECT_EQ(t.device.device_type, kDLCUDA) << "not on the emulated GPU";
  }
  if (t.device.device_type == kDLCUDA) {
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(float), /*cudaMemcpyDefault*/ 4), 0);
    return v;
  }
#endif
  std::memcpy(v.data(), p, n * sizeof(float));
  return v;
}

}  // namespace zoe::test

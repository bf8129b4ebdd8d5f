// DLPack tensors at the C API's edge: dtype mapping, shape checks, and strided reads into fp32.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "zoe/dtype.h"
#include "zoe/status.h"

namespace zoe::capi {

// The engine's weight dtypes as DLPack types and back (float32, bfloat16, float16; one lane).
DLDataType dl_dtype(DType t);
Result<DType> weight_dtype(DLDataType t, const std::string& what);
std::string dl_dtype_name(DLDataType t);

int64_t dl_numel(const DLTensor& t);
// Row-major without gaps (strides NULL, or equal to the compact ones; size-1 dims ignored).
bool dl_compact(const DLTensor& t);
// A tensor handed in (a gradient, an initial value; `noun` says which in messages): not null, a
// float dtype zoe reads (f16, bf16, f32, f64), data present, non-negative strides, and the expected
// shape (or, when shape is empty, `numel` elements in any shape).
Status check_tensor(const DLTensor* t, const std::vector<int64_t>& shape, int64_t numel, const std::string& what,
                    const char* noun);
// Host memory (kDLCPU): every element, in row-major order of the tensor's shape, as fp32.
void read_host_f32(const DLTensor& t, float* dst);

}  // namespace zoe::capi

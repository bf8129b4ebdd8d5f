// DLPack tensors at the C API's edge: dtype mapping, shape checks, and strided reads into fp32.
// Every count and offset a caller's shape, strides or byte offset imply is computed with overflow
// checks before anything is allocated or read: a tensor that overflows is refused, never wrapped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "zoe/dtype.h"
#include "zoe/status.h"

namespace zoe::capi {

// The most elements a parameter, a unit or a tensor handed in may have: the engine keeps 16 bytes
// an element at most (fp32 master, two moments, a gradient), and those byte counts are int64_t.
inline constexpr int64_t kMaxElements = INT64_MAX / 16;
// One past the highest address a tensor's bytes may reach: 2^56, the top of the largest user
// address space Linux gives a process (x86-64 with 5-level paging: 2^56 - 1 bytes; 4-level: 2^47;
// aarch64: 2^48 or 2^52). A byte_offset that takes a valid pointer past it points at no memory of
// the caller's, however far it stays below the wrap of the address space.
inline constexpr uint64_t kMaxUserAddress = uint64_t{1} << 56;
// DLPack sets no limit on ndim; torch's is 64, and a caller's shape array is read only up to it.
inline constexpr int kMaxDims = 64;

// The engine's weight dtypes as DLPack types and back (float32, bfloat16, float16; one lane).
DLDataType dl_dtype(DType t);
Result<DType> weight_dtype(DLDataType t, const std::string& what);
std::string dl_dtype_name(DLDataType t);

// The element count of shape[0..ndim): 0 when a dimension is 0; Invalid, naming `what`, `noun` and
// the dimension, when a dimension is negative or the product overflows or passes kMaxElements.
Result<int64_t> checked_numel(const int64_t* shape, int ndim, const std::string& what, const char* noun);

// Bytes [first, last) from a tensor's data pointer that its elements occupy (first = byte_offset;
// first == last when it has no elements).
struct ByteSpan {
  uint64_t first = 0, last = 0;
};
// The span of a tensor whose ndim, shape and strides are sane (as check_tensor checks them first);
// Invalid, naming the dimension, when a stride offset overflows, and when the span runs past
// PTRDIFF_MAX bytes or its last byte (t.data + byte_offset + span) lies at or past kMaxUserAddress.
Result<ByteSpan> byte_span(const DLTensor& t, const std::string& what, const char* noun);

// For tensors check_tensor accepted (their counts do not overflow):
int64_t dl_numel(const DLTensor& t);
// Row-major without gaps (strides NULL, or equal to the compact ones; size-1 dims ignored).
bool dl_compact(const DLTensor& t);
// A tensor handed in (a gradient, an initial value; `noun` says which in messages): not null, a
// float dtype zoe reads (f16, bf16, f32, f64), at most kMaxDims dimensions, data present,
// non-negative strides, an element count and a byte span that do not overflow, and the expected
// shape (or, when shape is empty, `numel` elements in any shape).
Status check_tensor(const DLTensor* t, const std::vector<int64_t>& shape, int64_t numel, const std::string& what,
                    const char* noun);
// Host memory (kDLCPU): every element, in row-major order of the tensor's shape, as fp32.
void read_host_f32(const DLTensor& t, float* dst);

}  // namespace zoe::capi

#include "capi/dlpack_tensor.h"

#include <cstdint>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace zoe::capi {

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::kF32: return {kDLFloat, 32, 1};
    case DType::kBF16: return {kDLBfloat, 16, 1};
    default: return {kDLFloat, 16, 1};
  }
}

std::string dl_dtype_name(DLDataType t) {
  const char* code = t.code == kDLFloat ? "float" : t.code == kDLBfloat ? "bfloat" : t.code == kDLInt ? "int"
                     : t.code == kDLUInt ? "uint" : "code" ;
  std::string s = fmt::format("{}{}", code, t.bits);
  return t.lanes == 1 ? s : fmt::format("{}x{}", s, t.lanes);
}

Result<DType> weight_dtype(DLDataType t, const std::string& what) {
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return DType::kF32;
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 16) return DType::kF16;
  return Status::Invalid(fmt::format("{}: dtype {} is not a weight dtype (float32, bfloat16, float16)", what,
                                     dl_dtype_name(t)));
}

Result<int64_t> checked_numel(const int64_t* shape, int ndim, const std::string& what, const char* noun) {
  for (int d = 0; d < ndim; ++d)
    if (shape[d] < 0)
      return Status::Invalid(fmt::format("{}: {} dimension {} is negative ({})", what, noun, d, shape[d]));
  for (int d = 0; d < ndim; ++d)
    if (shape[d] == 0) return int64_t{0};  // nothing to read, whatever the other dimensions say
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d)
    if (__builtin_mul_overflow(n, shape[d], &n) || n > kMaxElements)
      return Status::Invalid(fmt::format("{}: {} shape [{}] has more than {} elements, zoe's limit (the product "
                                         "passes it at dimension {})", what, noun,
                                         fmt::join(shape, shape + ndim, ", "), kMaxElements, d));
  return n;
}

Result<ByteSpan> byte_span(const DLTensor& t, const std::string& what, const char* noun) {
  ZOE_ASSIGN_OR_RETURN(int64_t n, checked_numel(t.shape, t.ndim, what, noun));
  if (n == 0) return ByteSpan{t.byte_offset, t.byte_offset};
  // The last element's offset in elements; with non-negative strides the first one's is 0.
  int64_t last = 0, compact = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    const int64_t stride = t.strides ? t.strides[d] : compact;
    if (stride < 0)
      return Status::Invalid(fmt::format("{}: {} stride {} is negative ({}; zoe reads non-negative strides)", what,
                                         noun, d, stride));
    int64_t reach = 0;
    if (__builtin_mul_overflow(t.shape[d] - 1, stride, &reach) || __builtin_add_overflow(last, reach, &last))
      return Status::Invalid(fmt::format("{}: {} stride {} ({}) times dimension {} ({}) overflows", what, noun, d,
                                         stride, d, t.shape[d]));
    compact *= t.shape[d];  // at most n
  }
  const uint64_t esize = (uint64_t{t.dtype.bits} * t.dtype.lanes + 7) / 8;
  uint64_t bytes = 0, end = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(last) + 1, esize, &bytes) ||
      __builtin_add_overflow(t.byte_offset, bytes, &end) || end > static_cast<uint64_t>(PTRDIFF_MAX))
    return Status::Invalid(fmt::format("{}: the {}'s byte offset ({}) and strides reach past {} bytes", what, noun,
                                       t.byte_offset, PTRDIFF_MAX));
  uint64_t top = 0;
  if (__builtin_add_overflow(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data)), end, &top))
    return Status::Invalid(fmt::format("{}: the {}'s byte offset ({}) and strides run past the end of the address "
                                       "space", what, noun, t.byte_offset));
  if (top > kMaxUserAddress)
    return Status::Invalid(fmt::format("{}: the {}'s data pointer ({}) plus byte_offset ({}) and the {} bytes its "
                                       "strides span reach past 2^56, above any user address", what, noun, t.data,
                                       t.byte_offset, end - t.byte_offset));
  return ByteSpan{t.byte_offset, end};
}

int64_t dl_numel(const DLTensor& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

bool dl_compact(const DLTensor& t) {
  if (!t.strides || dl_numel(t) == 0) return true;
  int64_t want = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != want) return false;
    want *= t.shape[d];
  }
  return true;
}

namespace {

bool readable_float(DLDataType t) {
  if (t.lanes != 1) return false;
  if (t.code == kDLBfloat) return t.bits == 16;
  return t.code == kDLFloat && (t.bits == 16 || t.bits == 32 || t.bits == 64);
}

// One element at p (any alignment) as fp32: float64 narrowed, the weight dtypes as dtype.h reads them.
float load(const char* p, DLDataType t) {
  if (t.bits == 64) {
    double d;
    std::memcpy(&d, p, 8);
    return static_cast<float>(d);
  }
  alignas(4) char e[4];
  std::memcpy(e, p, t.bits / 8);
  return load_as_f32(e, t.code == kDLBfloat ? DType::kBF16 : t.bits == 16 ? DType::kF16 : DType::kF32, 0);
}

}  // namespace

Status check_tensor(const DLTensor* t, const std::vector<int64_t>& shape, int64_t numel, const std::string& what,
                    const char* noun) {
  if (!t) return Status::Invalid(fmt::format("{}: the {} is a null pointer", what, noun));
  if (!readable_float(t->dtype))
    return Status::Invalid(fmt::format("{}: {} dtype {} (zoe reads float16, bfloat16, float32, float64)", what, noun,
                                       dl_dtype_name(t->dtype)));
  // Before any shape[d] is read: a huge ndim would read past the caller's array.
  if (t->ndim < 0 || t->ndim > kMaxDims)
    return Status::Invalid(fmt::format("{}: the {} has {} dimensions (zoe reads 0 to {})", what, noun, t->ndim,
                                       kMaxDims));
  if (t->ndim > 0 && !t->shape) return Status::Invalid(fmt::format("{}: the {} has no shape", what, noun));
  ZOE_ASSIGN_OR_RETURN(int64_t n, checked_numel(t->shape, t->ndim, what, noun));
  std::vector<int64_t> got(t->shape, t->shape + t->ndim);
  if (!shape.empty() ? got != shape : n != numel)
    return Status::Invalid(fmt::format("{}: {} of shape [{}], expected {}", what, noun, fmt::join(got, ", "),
                                       shape.empty() ? fmt::format("{} elements", numel)
                                                     : fmt::format("[{}]", fmt::join(shape, ", "))));
  if (!t->data && n > 0) return Status::Invalid(fmt::format("{}: the {}'s data is a null pointer", what, noun));
  return byte_span(*t, what, noun).status();
}

// Walks the shape in row-major order; the innermost dimension is a plain strided loop.
void read_host_f32(const DLTensor& t, float* dst) {
  const char* base = static_cast<const char*>(t.data) + t.byte_offset;
  const size_t esize = t.dtype.bits / 8;
  int64_t n = dl_numel(t);
  if (n == 0) return;
  if (dl_compact(t) && t.dtype.code == kDLFloat && t.dtype.bits == 32) {
    std::memcpy(dst, base, n * sizeof(float));
    return;
  }
  std::vector<int64_t> strides(t.ndim), idx(t.ndim, 0);
  int64_t s = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    strides[d] = t.strides ? t.strides[d] : s;
    s *= t.shape[d];
  }
  const int last = t.ndim - 1;
  const int64_t inner = t.ndim ? t.shape[last] : 1, inner_stride = t.ndim ? strides[last] : 0;
  for (int64_t done = 0; done < n; done += inner) {
    int64_t off = 0;
    for (int d = 0; d < last; ++d) off += idx[d] * strides[d];
    for (int64_t i = 0; i < inner; ++i) *dst++ = load(base + (off + i * inner_stride) * esize, t.dtype);
    for (int d = last - 1; d >= 0 && ++idx[d] == t.shape[d]; --d) idx[d] = 0;
  }
}

}  // namespace zoe::capi

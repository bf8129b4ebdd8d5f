// Fuzzes the DLPack tensor checks of the C API (check_tensor, src/capi/dlpack_tensor.h): every
// gradient and initial value a foreign framework hands to zoe_grad_param, zoe_grads_ready and
// zoe_set_param passes them before zoe reads a byte. ndim, dtype, shape, strides and byte offset
// come from the input, so no input may crash, overflow or read out of bounds: a bad one is an
// Invalid Status. An accepted tensor must lie where byte_span says (recomputed here in 128 bits),
// below kMaxUserAddress, and reading it from a heap block of exactly that size must stay inside
// it (ASan watches).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "capi/dlpack_tensor.h"

namespace {

// Reads the input front to back; past its end every read is 0.
struct Bytes {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{u8()} << (8 * i);
    return v;
  }
  // Mostly small values (a real shape or stride), sometimes any 64 bits.
  int64_t dim() {
    uint8_t b = u8();
    return b & 0x80 ? static_cast<int64_t>(u64()) : b;
  }
};

using i128 = __int128;

// What check_tensor promised, recomputed without its code: element count and byte span.
void expect_span(const DLTensor& t, const zoe::capi::ByteSpan& got) {
  bool empty = false;
  for (int d = 0; d < t.ndim; ++d) empty |= t.shape[d] == 0;
  if (empty) {
    if (zoe::capi::dl_numel(t) != 0 || got.first != t.byte_offset || got.last != t.byte_offset) std::abort();
    return;
  }
  // Each factor and term is below 2^64 and each partial result is checked below 2^63: no overflow.
  i128 numel = 1, last = 0, compact = 1;
  for (int d = 0; d < t.ndim; ++d)
    if ((numel *= t.shape[d]) > zoe::capi::kMaxElements) std::abort();
  if (numel != zoe::capi::dl_numel(t)) std::abort();
  for (int d = t.ndim - 1; d >= 0; --d) {
    const i128 stride = t.strides ? t.strides[d] : compact;
    if (stride < 0 || (last += (t.shape[d] - 1) * stride) > PTRDIFF_MAX) std::abort();
    compact *= t.shape[d];
  }
  const i128 end = i128{t.byte_offset} + (last + 1) * (t.dtype.bits / 8);
  if (got.first != t.byte_offset || i128{got.last} != end || end > PTRDIFF_MAX) std::abort();
  // A valid pointer plus a huge byte_offset (2^62) points at no memory of the caller's.
  if (i128{reinterpret_cast<uintptr_t>(t.data)} + end > i128{zoe::capi::kMaxUserAddress}) std::abort();
  if (zoe::capi::dl_compact(t) && end - t.byte_offset != numel * (t.dtype.bits / 8)) std::abort();
}

// Reads the tensor from a heap block that ends where its span ends, when that is small enough.
void read_within(DLTensor t, const zoe::capi::ByteSpan& span) {
  const int64_t numel = zoe::capi::dl_numel(t);
  if (numel == 0 || numel > (1 << 16) || span.last > (1 << 16)) return;
  std::vector<uint8_t> block(span.last);
  std::memset(block.data(), 0x3c, block.size());
  t.data = block.data();
  if (!zoe::capi::check_tensor(&t, {}, numel, "fuzz", "tensor").ok()) std::abort();
  std::vector<float> out(numel);
  zoe::capi::read_host_f32(t, out.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in{data, size};
  const uint8_t shape_byte = in.u8();
  // Mostly 0..7 dimensions; sometimes any int32 (negative, or far past the shape array below).
  const int32_t ndim = shape_byte & 0x80 ? static_cast<int32_t>(in.u64()) : shape_byte & 7;
  DLDataType dtype{in.u8(), in.u8(), static_cast<uint16_t>(in.u8() % 3)};
  const uint8_t flags = in.u8();
  const uint64_t byte_offset = flags & 1 ? in.u64() : in.u8();
  // The arrays hold at most one entry more than check_tensor may read: reading past ndim 64, or
  // past ndim, is an ASan error.
  const size_t entries = ndim < 0 ? 0 : ndim > zoe::capi::kMaxDims ? zoe::capi::kMaxDims + 1 : ndim;
  std::vector<int64_t> shape(entries), strides(entries);
  for (size_t d = 0; d < entries; ++d) shape[d] = in.dim();
  for (size_t d = 0; d < entries; ++d) strides[d] = in.dim();

  static uint8_t somewhere[16];
  DLTensor t{};
  t.data = flags & 2 ? nullptr : somewhere;
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = entries ? shape.data() : nullptr;
  t.strides = flags & 4 && entries ? strides.data() : nullptr;
  t.byte_offset = byte_offset;
  (void)zoe::capi::weight_dtype(dtype, "fuzz");
  (void)zoe::capi::dl_dtype_name(dtype);

  // Both ways the C API checks: against a parameter's shape, and against a unit's element count.
  zoe::Status by_shape = zoe::capi::check_tensor(&t, shape, 0, "fuzz", "tensor");
  zoe::Result<int64_t> n = zoe::capi::checked_numel(shape.data(), static_cast<int>(entries), "fuzz", "tensor");
  zoe::Status by_numel = zoe::capi::check_tensor(&t, {}, n.ok() ? *n : 1, "fuzz", "tensor");
  if (!by_shape.ok() && !by_numel.ok()) return 0;
  if (ndim < 0 || ndim > zoe::capi::kMaxDims || !n.ok()) std::abort();  // accepted what it cannot hold
  zoe::Result<zoe::capi::ByteSpan> span = zoe::capi::byte_span(t, "fuzz", "tensor");
  if (!span.ok()) std::abort();
  expect_span(t, *span);
  read_within(t, *span);
  return 0;
}

// The reduction arithmetic of every Comm: chunks summed in rank order, in fp32 (comm.h says why).
#include <tbb/parallel_for.h>

#include "comm/comm.h"

namespace zoe {

void sum_chunks_in_order(const void* chunks, int n, size_t count, DType dtype, void* out) {
  const char* base = static_cast<const char*>(chunks);
  size_t chunk_bytes = count * dtype_size(dtype);
  // Element-wise, so splitting across threads cannot change any sum.
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, 1 << 14), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t i = r.begin(); i < r.end(); ++i) {
      float s = load_as_f32(base, dtype, i);
      for (int k = 1; k < n; ++k) s += load_as_f32(base + k * chunk_bytes, dtype, i);
      store_from_f32(out, dtype, i, s);
    }
  });
}

}  // namespace zoe

// The reduction arithmetic of every Comm: chunks summed in rank order, in fp32 (comm.h says why).
#include <tbb/parallel_for.h>

#include "comm/comm.h"

namespace zoe {
namespace {

// One dtype per instantiation, so the fp32 loop vectorises (a switch per element does not).
template <DType T>
void sum_range(const char* base, int n, size_t chunk_bytes, void* out, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) {
    float s = load_as_f32(base, T, i);
    for (int k = 1; k < n; ++k) s += load_as_f32(base + k * chunk_bytes, T, i);
    store_from_f32(out, T, i, s);
  }
}

// Below this many elements one thread sums: with a rank per core, extra threads only compete
// with the other ranks' MPI progress.
constexpr size_t kParallelFrom = size_t{1} << 20;

}  // namespace

void sum_chunks_in_order(const void* chunks, int n, size_t count, DType dtype, void* out) {
  const char* base = static_cast<const char*>(chunks);
  size_t chunk_bytes = count * dtype_size(dtype);
  auto run = [&](size_t lo, size_t hi) {
    switch (dtype) {
      case DType::kF32: return sum_range<DType::kF32>(base, n, chunk_bytes, out, lo, hi);
      case DType::kBF16: return sum_range<DType::kBF16>(base, n, chunk_bytes, out, lo, hi);
      default: return sum_range<DType::kF16>(base, n, chunk_bytes, out, lo, hi);
    }
  };
  if (count < kParallelFrom) return run(0, count);
  // Element-wise, so splitting across threads cannot change any sum.
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, 1 << 16),
                    [&](const tbb::blocked_range<size_t>& r) { run(r.begin(), r.end()); });
}

}  // namespace zoe

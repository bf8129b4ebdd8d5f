// Internal helpers of the gpt2 ops: TBB loops with fixed, thread-count independent partitions.
#pragma once
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>

namespace zoe::gpt2::detail {

// Calls f(begin, end) on disjoint pieces of [0, n), each of at least `grain` items.
template <class F>
void parallel_range(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, std::max<int64_t>(grain, 1)),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); });
}

// Rows per task so that one task touches about 16K floats: enough work to beat the
// scheduling cost, small enough to spread N=B*T rows over the cores.
inline int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_len, 1));
}

// Reductions over rows (dw/db of layernorm) use chunks of a size that depends only on the row
// count, and sum the per-chunk partials in chunk order: the result is bitwise the same for any
// number of threads, so ranks and reruns agree.
constexpr int64_t kReduceChunkRows = 64;
inline int64_t num_reduce_chunks(int64_t n) { return (n + kReduceChunkRows - 1) / kReduceChunkRows; }

}  // namespace zoe::gpt2::detail

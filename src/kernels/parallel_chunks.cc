#include "kernels/parallel_chunks.h"

#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>

namespace zoe {

namespace {
// More threads than the process may run on cannot be had from oneTBB anyway (it warns).
int usable_threads(int threads) {
  const int cores = tbb::info::default_concurrency();
  return threads <= 0 || threads > cores ? cores : threads;
}
}  // namespace

void parallel_items(size_t items, int threads, const std::function<void(size_t)>& fn) {
  threads = usable_threads(threads);
  if (threads == 1 || items < 2) {
    for (size_t i = 0; i < items; ++i) fn(i);
    return;
  }
  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, items, 1),
        [&](const tbb::blocked_range<size_t>& r) {
          for (size_t i = r.begin(); i != r.end(); ++i) fn(i);
        },
        tbb::static_partitioner());
  });
}

size_t parallel_chunks(size_t n, int threads, const std::function<size_t(size_t, size_t)>& fn) {
  const size_t chunks = (n + kChunkElems - 1) / kChunkElems;
  // Too little work to share: waking threads would cost more than the loop.
  if (usable_threads(threads) == 1 || chunks < 2) return n ? fn(0, n) : 0;
  // The atomic also orders the workers' writes before the caller's reads for ThreadSanitizer,
  // which does not see oneTBB's own hand-offs.
  std::atomic<size_t> total{0};
  parallel_items(chunks, threads, [&](size_t c) {
    total.fetch_add(fn(c * kChunkElems, std::min(n, (c + 1) * kChunkElems)), std::memory_order_relaxed);
  });
  return total.load();
}

}  // namespace zoe

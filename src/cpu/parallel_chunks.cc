#include "cpu/parallel_chunks.h"

#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <atomic>

namespace zoe {

size_t parallel_chunks(size_t n, int threads, const std::function<size_t(size_t, size_t)>& fn) {
  // More threads than the process may run on cannot be had from oneTBB anyway (it warns).
  const int cores = tbb::info::default_concurrency();
  if (threads <= 0 || threads > cores) threads = cores;
  const size_t chunks = (n + kChunkElems - 1) / kChunkElems;
  // Too little work to share: waking threads would cost more than the loop.
  if (threads == 1 || chunks < 2) return n ? fn(0, n) : 0;

  std::atomic<size_t> total{0};
  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, chunks, 1),
        [&](const tbb::blocked_range<size_t>& cr) {
          const size_t begin = cr.begin() * kChunkElems;
          const size_t end = cr.end() * kChunkElems < n ? cr.end() * kChunkElems : n;
          total.fetch_add(fn(begin, end), std::memory_order_relaxed);
        },
        tbb::static_partitioner());
  });
  return total.load();
}

}  // namespace zoe

// Static, chunked parallel loop over [0, n) on a oneTBB arena of a given size.
#pragma once
#include <cstddef>
#include <functional>

namespace zoe {

// Chunks are multiples of 64 elements, so every thread's piece starts on a cache line of
// fp32 data and a vector kernel's tail appears only at the very end of the range.
inline constexpr size_t kChunkElems = 64 * 1024;

// Runs fn(begin, end) over consecutive 64-aligned pieces of [0, n) on `threads` threads
// (0, or more than the process may run on: all it may run on) with tbb::static_partitioner: each thread gets one contiguous,
// equal share, the same on every call. Returns the sum of what fn returned.
size_t parallel_chunks(size_t n, int threads, const std::function<size_t(size_t, size_t)>& fn);

// The mechanism under it: fn(i) for each item of [0, items) on an arena of `threads` threads
// (same rule) of its own, static partition. A thread waiting in it runs only its items, never
// tasks of the caller's arena. Inline when there is one thread or item.
void parallel_items(size_t items, int threads, const std::function<void(size_t)>& fn);

}  // namespace zoe

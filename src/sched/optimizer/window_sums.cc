#include "sched/optimizer/window_sums.h"

#include <algorithm>

#include "common/checksum.h"
#include "kernels/parallel_chunks.h"

namespace zoe {
namespace {

// Elements per piece: 64 KiB of each fp32 array, so that a piece of the three state arrays, its
// gradients and its weight copy stay in L2 between hashing and stepping.
constexpr int64_t kPieceElems = 16384;

// Adam on the parts of `ranges` inside [p, q); `ri` is the first range that may reach p.
size_t step_piece(const AdamHyper& h, std::span<const IndexedAdamRange> ranges, size_t ri, int64_t p, int64_t q,
                  Isa isa) {
  size_t bad = 0;
  for (size_t j = ri; j < ranges.size() && ranges[j].e < q; ++j) {
    const IndexedAdamRange& x = ranges[j];
    int64_t lo = std::max(p, x.e), hi = std::min<int64_t>(q, x.e + static_cast<int64_t>(x.r.n));
    if (lo < hi) bad += adam_step_range(h, adam_sub_range(x.r, lo - x.e, hi - x.e), isa);
  }
  return bad;
}

// The first task's error in window order, else the non-finite count of all tasks.
Result<size_t> sum_tasks(const std::vector<Status>& errors, const std::vector<size_t>& bad) {
  size_t nonfinite = 0;
  for (size_t ti = 0; ti < errors.size(); ++ti) {
    ZOE_RETURN_IF_ERROR(errors[ti]);
    nonfinite += bad[ti];
  }
  return nonfinite;
}

}  // namespace

std::shared_ptr<BlockSums> make_block_sums(const StateArray& array, int64_t a, int64_t b, bool read) {
  WholeBlocks w = array.caller_blocks(a, b - a);
  auto s = std::make_shared<BlockSums>();
  s->first = w.first;
  s->sums.assign(w.count, 0);
  if (read) s->check.assign(w.count, 0);
  return s;
}

Result<size_t> adam_with_block_sums(const AdamHyper& h, std::span<const IndexedAdamRange> ranges, int64_t a,
                                    int64_t b, std::span<const HashedArray> arrays) {
  // Every array's blocks begin at the segment's first element; the coarsest grid (the largest
  // block in elements: the 2-byte weights') cuts the window into tasks, each of which holds
  // whole blocks of every finer grid.
  const int64_t origin = arrays.front().array->segment_begin(a);
  int64_t coarse = 0;
  std::vector<WholeBlocks> whole;
  for (const HashedArray& x : arrays) {
    coarse = std::max(coarse, x.array->block_elems());
    whole.push_back(x.array->caller_blocks(a, b - a));
  }
  std::vector<std::pair<int64_t, int64_t>> tasks;
  for (int64_t t0 = a; t0 < b;) {
    const int64_t t1 = std::min(b, origin + ((t0 - origin) / coarse + 1) * coarse);
    tasks.push_back({t0, t1});
    t0 = t1;
  }
  // Array i's block of element e, as an index into its BlockSums; -1 when the window does not
  // cover that block whole (the I/O thread hashes it).
  auto sum_index = [&](size_t i, int64_t e) -> int64_t {
    const uint64_t blk = arrays[i].array->block_of(e);
    return blk >= whole[i].first && blk - whole[i].first < whole[i].count ? int64_t(blk - whole[i].first) : -1;
  };
  auto block_end = [&](size_t i, int64_t e) {
    const int64_t be = arrays[i].array->block_elems();
    return origin + ((e - origin) / be + 1) * be;
  };
  const Isa isa = best_isa();
  std::vector<Status> errors(tasks.size());
  std::vector<size_t> bad(tasks.size(), 0);
  auto at = [&](const HashedArray& x, int64_t e) { return x.window + (e - a) * x.array->esize(); };
  auto run_task = [&](size_t ti) {
    const int64_t t0 = tasks[ti].first, t1 = tasks[ti].second;  // not a binding: clang's lambdas cannot capture one
    std::vector<Checksum> in(arrays.size()), out(arrays.size());
    // The first range that reaches t0.
    size_t ri = std::partition_point(ranges.begin(), ranges.end(),
                                     [&](const IndexedAdamRange& x) {
                                       return x.e + static_cast<int64_t>(x.r.n) <= t0;
                                     }) - ranges.begin();
    std::vector<int64_t> k(arrays.size()), end(arrays.size());  // each array's block at p
    for (int64_t p = t0; p < t1;) {
      // Pieces end where any array's block does, so that each sum sees exactly its block's bytes.
      int64_t q = std::min(t1, p + kPieceElems);
      for (size_t i = 0; i < arrays.size(); ++i) {
        k[i] = sum_index(i, p), end[i] = block_end(i, p);
        q = std::min(q, end[i]);
      }
      for (size_t i = 0; i < arrays.size(); ++i)
        if (arrays[i].in && k[i] >= 0) in[i].update(at(arrays[i], p), (q - p) * arrays[i].array->esize());
      bad[ti] += step_piece(h, ranges, ri, p, q, isa);
      for (size_t i = 0; i < arrays.size(); ++i) {
        const HashedArray& x = arrays[i];
        if (k[i] < 0) continue;
        out[i].update(at(x, p), (q - p) * x.array->esize());
        if (q != t1 && q != end[i]) continue;
        if (x.in && x.in->check[k[i]] && errors[ti].ok())
          errors[ti] = x.array->check_sum(whole[i].first + k[i], x.in->sums[k[i]], in[i].digest());
        x.out->sums[k[i]] = out[i].digest();
        in[i].reset(), out[i].reset();
      }
      while (ri < ranges.size() && ranges[ri].e + static_cast<int64_t>(ranges[ri].r.n) <= q) ++ri;
      p = q;
    }
  };
  // As adam_step: inline below two chunks (waking threads would cost more than the loop), else an
  // arena of its own, so this thread waiting for other tasks never runs the compute's tasks (a
  // GEMM slice would hold up the write-backs and the next forward).
  parallel_items(tasks.size(), b - a < static_cast<int64_t>(2 * kChunkElems) ? 1 : 0, run_task);
  return sum_tasks(errors, bad);
}

}  // namespace zoe

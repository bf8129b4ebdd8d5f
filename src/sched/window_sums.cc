#include "sched/window_sums.h"

#include <algorithm>

#include "ckpt/checksum.h"
#include "cpu/parallel_chunks.h"

namespace zoe {
namespace {

// Elements per piece: 64 KiB of each fp32 array, so that a piece of the three state arrays, its
// gradients and its weight copy stay in L2 between hashing and stepping.
constexpr int64_t kPieceElems = 16384;

// One cell: elements [c0, c1) of the window, within one block of the grid. `hashed` when the
// window covers that block whole (its index among the arrays' BlockSums is k).
struct Cell {
  int64_t c0 = 0, c1 = 0;
  bool hashed = false;
  uint64_t k = 0;
};

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

// The first cell's error in window order, else the non-finite count of all cells.
Result<size_t> sum_cells(const std::vector<Status>& errors, const std::vector<size_t>& bad) {
  size_t nonfinite = 0;
  for (size_t ci = 0; ci < errors.size(); ++ci) {
    ZOE_RETURN_IF_ERROR(errors[ci]);
    nonfinite += bad[ci];
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
  const StateArray& grid = *arrays.front().array;
  // The window lies in one segment, whose blocks begin at its first element.
  const int64_t origin = grid.segment_begin(a), be = grid.block_elems();
  const size_t esize = grid.esize();
  const WholeBlocks whole = grid.caller_blocks(a, b - a);
  std::vector<Cell> cells;
  for (int64_t c0 = a; c0 < b;) {
    const int64_t c1 = std::min(b, origin + ((c0 - origin) / be + 1) * be);
    const uint64_t ub = grid.block_of(c0);
    const bool hashed = ub >= whole.first && ub - whole.first < whole.count;
    cells.push_back({c0, c1, hashed, hashed ? ub - whole.first : 0});
    c0 = c1;
  }
  const Isa isa = best_isa();
  std::vector<Status> errors(cells.size());
  std::vector<size_t> bad(cells.size(), 0);
  auto at = [&](const HashedArray& x, int64_t e) { return x.window + (e - a) * esize; };
  auto run_cell = [&](size_t ci) {
    const Cell& c = cells[ci];
    std::vector<Checksum> in(c.hashed ? arrays.size() : 0), out(c.hashed ? arrays.size() : 0);
    // The first range that reaches c0.
    size_t ri = std::partition_point(ranges.begin(), ranges.end(),
                                     [&](const IndexedAdamRange& x) {
                                       return x.e + static_cast<int64_t>(x.r.n) <= c.c0;
                                     }) - ranges.begin();
    for (int64_t p = c.c0; p < c.c1; p += kPieceElems) {
      const int64_t q = std::min(p + kPieceElems, c.c1);
      const size_t bytes = static_cast<size_t>(q - p) * esize;
      for (size_t i = 0; i < in.size(); ++i)
        if (arrays[i].in) in[i].update(at(arrays[i], p), bytes);
      bad[ci] += step_piece(h, ranges, ri, p, q, isa);
      for (size_t i = 0; i < out.size(); ++i) out[i].update(at(arrays[i], p), bytes);
      while (ri < ranges.size() && ranges[ri].e + static_cast<int64_t>(ranges[ri].r.n) <= q) ++ri;
    }
    for (size_t i = 0; i < out.size(); ++i) {
      const HashedArray& x = arrays[i];
      if (x.in && x.in->check[c.k] && errors[ci].ok())
        errors[ci] = x.array->check_sum(whole.first + c.k, x.in->sums[c.k], in[i].digest());
      x.out->sums[c.k] = out[i].digest();
    }
  };
  // As adam_step: inline below two chunks (waking threads would cost more than the loop), else an
  // arena of its own, so this thread waiting for other cells never runs the compute's tasks (a
  // GEMM slice would hold up the write-backs and the next forward).
  parallel_items(cells.size(), b - a < static_cast<int64_t>(2 * kChunkElems) ? 1 : 0, run_cell);
  return sum_cells(errors, bad);
}

}  // namespace zoe

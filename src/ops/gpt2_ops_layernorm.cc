// LayerNorm over the channel axis, eps 1e-5.
#include <cmath>
#include <vector>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"

namespace zoe::gpt2 {

// A row's sums are sequential fp32 chains (the reference order, kept bitwise), so one row alone
// waits on the adder's latency at every element. kGroup rows at a time run kGroup independent
// chains side by side: each row's sums still add in the same order, so the results are the same
// bits, only the latency overlaps.
constexpr int kGroup = 8;

// mean and rstd of R rows from x (row k at x + k * C): two passes, mean then squared deviations,
// so no cancellation for rows with a large mean.
template <int R>
static void row_stats(const float* x, int C, float* mean, float* rstd) {
  float m[R], v[R];
  for (int k = 0; k < R; k++) m[k] = 0.f, v[k] = 0.f;
  for (int c = 0; c < C; c++)
    for (int k = 0; k < R; k++) m[k] += x[int64_t{k} * C + c];
  for (int k = 0; k < R; k++) m[k] /= C;
  for (int c = 0; c < C; c++)
    for (int k = 0; k < R; k++) {
      const float d = x[int64_t{k} * C + c] - m[k];
      v[k] += d * d;
    }
  for (int k = 0; k < R; k++) {
    mean[k] = m[k];
    rstd[k] = 1.f / std::sqrt(v[k] / C + 1e-5f);
  }
}

// Rows [r0, r1) into out (fp32), or rounded to bf16 into out16 (the same values, rounded).
static void layernorm_rows(float* out, uint16_t* out16, float* mean, float* rstd, const float* inp, const float* w,
                           const float* b, int64_t r0, int64_t r1, int C) {
  thread_local std::vector<float> row;
  if (out16 && row.size() < size_t(C)) row.resize(C);
  int64_t r = r0;
  for (; r + kGroup <= r1; r += kGroup) row_stats<kGroup>(inp + r * C, C, mean + r, rstd + r);
  for (; r < r1; r++) row_stats<1>(inp + r * C, C, mean + r, rstd + r);
  for (r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    const float m = mean[r], s = rstd[r];
    float* o = out16 ? row.data() : out + r * C;
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
    if (out16) detail::round_range(out16 + r * C, o, C);
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C) {
  detail::parallel_range(N, detail::row_grain(C), [&](int64_t r0, int64_t r1) {
    layernorm_rows(out, nullptr, mean, rstd, inp, w, b, r0, r1, C);
  });
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, int N, int C) {
  detail::parallel_range(N, detail::row_grain(C), [&](int64_t r0, int64_t r1) {
    layernorm_rows(nullptr, out, mean, rstd, inp, w, b, r0, r1, C);
  });
}

// dinp for rows [r0, r1); dw/db partials of those rows added into pw/pb (if non-null).
static void layernorm_backward_rows(float* dinp, float* pw, float* pb, const float* dout,
                                    const float* inp, const float* w, const float* mean,
                                    const float* rstd, int64_t r0, int64_t r1, int C) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    const float* d = dout + r * C;
    const float m = mean[r], s = rstd[r];
    // dx = s * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w.
    float dn_mean = 0.f, dn_xhat_mean = 0.f;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s, dn = d[c] * w[c];
      dn_mean += dn;
      dn_xhat_mean += dn * xhat;
      if (pw) pw[c] += d[c] * xhat;
      if (pb) pb[c] += d[c];
    }
    dn_mean /= C;
    dn_xhat_mean /= C;
    if (!dinp) continue;
    float* g = dinp + r * C;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      g[c] += s * (d[c] * w[c] - dn_mean - xhat * dn_xhat_mean);
    }
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  const int64_t chunks = detail::num_reduce_chunks(N);
  std::vector<float> part(dw || db ? chunks * 2 * C : 0, 0.f);
  detail::parallel_range(chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k++) {
      float* pw = dw ? part.data() + k * 2 * C : nullptr;
      float* pb = db ? part.data() + k * 2 * C + C : nullptr;
      int64_t r0 = k * detail::kReduceChunkRows;
      int64_t r1 = std::min<int64_t>(N, r0 + detail::kReduceChunkRows);
      layernorm_backward_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C);
    }
  });
  if (!dw && !db) return;
  detail::parallel_range(C, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t k = 0; k < chunks; k++) {
      const float* p = part.data() + k * 2 * C;
      for (int64_t c = c0; c < c1; c++) {
        if (dw) dw[c] += p[c];
        if (db) db[c] += p[C + c];
      }
    }
  });
}

}  // namespace zoe::gpt2

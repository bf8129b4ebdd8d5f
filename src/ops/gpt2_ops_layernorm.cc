// LayerNorm over the channel axis, eps 1e-5.
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"
#include "zoe/dtype.h"

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

// Rows [r0, r1) into out.
static void layernorm_rows(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                           int64_t r0, int64_t r1, int C) {
  int64_t r = r0;
  for (; r + kGroup <= r1; r += kGroup) row_stats<kGroup>(inp + r * C, C, mean + r, rstd + r);
  for (; r < r1; r++) row_stats<1>(inp + r * C, C, mean + r, rstd + r);
  for (r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    const float m = mean[r], s = rstd[r];
    float* o = out + r * C;
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C) {
  detail::parallel_range(N, detail::row_grain(C), [&](int64_t r0, int64_t r1) {
    layernorm_rows(out, mean, rstd, inp, w, b, r0, r1, C);
  });
}

// bf16 compute's rows: the sums in 16 lanes (then one by one), the output rounded as it is made.
// Not layernorm_rows' bits (its chains keep fp32 training's): within an fp32 rounding of them.
ZOE_SIMD_CLONES static void layernorm_rows_lanes(uint16_t* out, float* mean, float* rstd, const float* inp,
                                                 const float* w, const float* b, int64_t r0, int64_t r1, int C) {
  using namespace detail;
  for (int64_t r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    v16f acc = {};
    int c = 0;
    for (; c + 16 <= C; c += 16) acc += load16(x + c);
    float sum = hsum(lo8(acc) + hi8(acc));
    for (; c < C; c++) sum += x[c];
    const float m = sum / C;
    acc = v16f{};
    for (c = 0; c + 16 <= C; c += 16) {
      const v16f dv = load16(x + c) - m;
      acc += dv * dv;
    }
    float var = hsum(lo8(acc) + hi8(acc));
    for (; c < C; c++) var += (x[c] - m) * (x[c] - m);
    const float s = 1.f / std::sqrt(var / C + 1e-5f);
    mean[r] = m;
    rstd[r] = s;
    uint16_t* o = out + r * C;
    for (c = 0; c + 16 <= C; c += 16) {
      const v16h h = bf16x16((load16(x + c) - m) * s * load16(w + c) + load16(b + c));
      std::memcpy(o + c, &h, sizeof h);
    }
    for (; c < C; c++) o[c] = f32_to_bf16((x[c] - m) * s * w[c] + b[c]);
  }
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, int N, int C) {
  detail::parallel_range(N, detail::row_grain(C), [&](int64_t r0, int64_t r1) {
    layernorm_rows_lanes(out, mean, rstd, inp, w, b, r0, r1, C);
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

// layernorm_backward_rows with the row's sums in 16 lanes (then 8, then one by one) and every
// pass a vector loop: bf16 compute's, whose bits need not be fp32 training's.
ZOE_SIMD_CLONES static void layernorm_backward_rows_lanes(float* dinp, float* pw, float* pb, const float* dout,
                                                          const float* inp, const float* w, const float* mean,
                                                          const float* rstd, int64_t r0, int64_t r1, int C) {
  using namespace detail;
  for (int64_t r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    const float* d = dout + r * C;
    const float m = mean[r], s = rstd[r];
    v16f dn16 = {}, dnx16 = {};
    int c = 0;
    for (; c + 16 <= C; c += 16) {
      const v16f xhat = (load16(x + c) - m) * s, dv = load16(d + c), dn = dv * load16(w + c);
      dn16 += dn;
      dnx16 += dn * xhat;
      if (pw) store16(pw + c, load16(pw + c) + dv * xhat);
      if (pb) store16(pb + c, load16(pb + c) + dv);
    }
    float dn_mean = hsum(lo8(dn16) + hi8(dn16)), dn_xhat_mean = hsum(lo8(dnx16) + hi8(dnx16));
    for (; c < C; c++) {
      const float xhat = (x[c] - m) * s, dn = d[c] * w[c];
      dn_mean += dn;
      dn_xhat_mean += dn * xhat;
      if (pw) pw[c] += d[c] * xhat;
      if (pb) pb[c] += d[c];
    }
    dn_mean /= C;
    dn_xhat_mean /= C;
    if (!dinp) continue;
    float* g = dinp + r * C;
    for (c = 0; c + 16 <= C; c += 16) {
      const v16f xhat = (load16(x + c) - m) * s;
      store16(g + c, load16(g + c) + s * (load16(d + c) * load16(w + c) - dn_mean - xhat * dn_xhat_mean));
    }
    for (; c < C; c++) g[c] += s * (d[c] * w[c] - dn_mean - ((x[c] - m) * s) * dn_xhat_mean);
  }
}

template <class Rows>
static void layernorm_backward_chunks(const Rows& rows, float* dinp, float* dw, float* db, const float* dout,
                                      const float* inp, const float* w, const float* mean, const float* rstd, int N,
                                      int C) {
  const int64_t chunks = detail::num_reduce_chunks(N);
  std::vector<float> part(dw || db ? chunks * 2 * C : 0, 0.f);
  detail::parallel_range(chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k++) {
      float* pw = dw ? part.data() + k * 2 * C : nullptr;
      float* pb = db ? part.data() + k * 2 * C + C : nullptr;
      int64_t r0 = k * detail::kReduceChunkRows;
      int64_t r1 = std::min<int64_t>(N, r0 + detail::kReduceChunkRows);
      rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C);
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

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_chunks(layernorm_backward_rows, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void layernorm_backward_bf16(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                             const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_chunks(layernorm_backward_rows_lanes, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

}  // namespace zoe::gpt2

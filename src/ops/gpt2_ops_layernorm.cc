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

// One layernorm_backward_bf16 call's operands (model_ops.def).
struct LnGrad {
  float *dinp, *dsum, *dw, *db;
  uint16_t* dinp16;
  const float *dres, *dout, *inp, *w, *mean, *rstd;
  int C;
};

// layernorm_backward_rows with the row's sums in 16 lanes (then one by one) and every pass a
// vector loop: bf16 compute's, whose bits need not be fp32 training's. pw, pb, ps: the chunk's
// sums of dw, db and (dinp16 set) dinp.
ZOE_SIMD_CLONES static void layernorm_backward_rows_lanes(const LnGrad& a, float* pw, float* pb, float* ps, int64_t r0,
                                                          int64_t r1) {
  using namespace detail;
  const int C = a.C;
  const float* w = a.w;
  for (int64_t r = r0; r < r1; r++) {
    const float* x = a.inp + r * C;
    const float* d = a.dout + r * C;
    const float m = a.mean[r], s = a.rstd[r];
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
    if (!a.dinp) continue;
    float* g = a.dinp + r * C;
    const float* res = a.dres ? a.dres + r * C : nullptr;
    uint16_t* g16 = a.dinp16 ? a.dinp16 + r * C : nullptr;
    for (c = 0; c + 16 <= C; c += 16) {
      const v16f xhat = (load16(x + c) - m) * s;
      const v16f v = (res ? load16(res + c) : v16f{}) +
                     s * (load16(d + c) * load16(w + c) - dn_mean - xhat * dn_xhat_mean);
      store16(g + c, v);
      if (!g16) continue;
      const v16h h = bf16x16(v);
      std::memcpy(g16 + c, &h, sizeof h);
      store16(ps + c, load16(ps + c) + v);
    }
    for (; c < C; c++) {
      const float v = (res ? res[c] : 0.f) + s * (d[c] * w[c] - dn_mean - ((x[c] - m) * s) * dn_xhat_mean);
      g[c] = v;
      if (!g16) continue;
      g16[c] = f32_to_bf16(v);
      ps[c] += v;
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

// The chunks' sums as layernorm_backward's, with a third, dinp's column sums, where dinp16 is set.
void layernorm_backward_bf16(float* dinp, uint16_t* dinp16, float* dsum, float* dw, float* db, const float* dres,
                             const float* dout, const float* inp, const float* w, const float* mean,
                             const float* rstd, int N, int C) {
  const LnGrad a{dinp, dsum, dw, db, dinp && dsum ? dinp16 : nullptr, dres, dout, inp, w, mean, rstd, C};
  const int64_t chunks = detail::num_reduce_chunks(N);
  std::vector<float> part(dw || db || a.dinp16 ? chunks * 3 * C : 0, 0.f);
  detail::parallel_range(chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k++) {
      float* p = part.empty() ? nullptr : part.data() + k * 3 * C;  // no sums asked for: none
      const int64_t r0 = k * detail::kReduceChunkRows;
      layernorm_backward_rows_lanes(a, dw ? p : nullptr, db ? p + C : nullptr, a.dinp16 ? p + 2 * C : nullptr, r0,
                                    std::min<int64_t>(N, r0 + detail::kReduceChunkRows));
    }
  });
  if (!dw && !db && !a.dinp16) return;
  detail::parallel_range(C, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c++) {
      float sum = 0.f;
      for (int64_t k = 0; k < chunks; k++) {
        const float* p = part.data() + k * 3 * C;
        if (dw) dw[c] += p[c];
        if (db) db[c] += p[C + c];
        sum += p[2 * C + c];
      }
      if (a.dinp16) dsum[c] = sum;
    }
  });
}

}  // namespace zoe::gpt2

// GELU, tanh approximation (GPT-2's "gelu_new").
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"
#include "zoe/dtype.h"

namespace zoe::gpt2 {

namespace {

using detail::v8f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;
constexpr int64_t kGrain = 16384;

template <class V, class I>
ZOE_INLINE V gelu_lanes(V x) {
  return 0.5f * x * (1.f + detail::tanh_lanes<V, I>(kGeluScale * (x + kGeluCube * x * x * x)));
}

template <class V, class I>
ZOE_INLINE V gelu_grad_lanes(V x) {
  const V th = detail::tanh_lanes<V, I>(kGeluScale * (x + kGeluCube * x * x * x));
  // d/dx tanh(u) = (1 - tanh^2(u)) du/dx: no cosh, which would overflow for large u.
  const V dth = (1.f - th * th) * kGeluScale * (1.f + 3.f * kGeluCube * x * x);
  return 0.5f * (1.f + th) + 0.5f * x * dth;
}
ZOE_INLINE v8f gelu8(v8f x) { return gelu_lanes<v8f, detail::v8i>(x); }
ZOE_INLINE v8f gelu_grad8(v8f x) { return gelu_grad_lanes<v8f, detail::v8i>(x); }
using detail::v16f;
using detail::v16i;

// 16 lanes a step, then 8, then the tail: each element the same operations, so the same bits
// as 8 lanes throughout (tested); the v4 clone runs the 16 in one AVX-512 register.
ZOE_SIMD_CLONES void gelu_forward_range(float* out, const float* inp, int64_t i0, int64_t i1) {
  using namespace detail;
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) store16(out + i, gelu_lanes<v16f, v16i>(load16(inp + i)));
  for (; i + 8 <= i1; i += 8) store8(out + i, gelu8(load8(inp + i)));
  if (i < i1) store8n(out + i, gelu8(load8n(inp + i, i1 - i)), i1 - i);
}

// bf16 in, bf16 out: 256 at a time through a buffer in L1, widened, then rounded. Rounding each
// vector as it is made ran 1.75x slower than the fp32 loop (Zen 4, AVX2 and AVX-512 clones
// alike); this way 1.25x.
constexpr int64_t kBuf = 256;
ZOE_SIMD_CLONES void gelu_forward_bf16_range(uint16_t* out, const uint16_t* inp, int64_t i0, int64_t i1) {
  float buf[kBuf];
  for (int64_t i = i0; i < i1; i += kBuf) {
    const int64_t n = std::min(kBuf, i1 - i);
    detail::widen_range(buf, inp + i, n);
    gelu_forward_range(buf, buf, 0, n);
    detail::round_range(out + i, buf, n);
  }
}

// overwrite: dinp's old contents are not read (the sum starts from 0).
ZOE_SIMD_CLONES void gelu_backward_range(float* dinp, const float* inp, const float* dout, int64_t i0, int64_t i1,
                                         bool overwrite) {
  using namespace detail;
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const v16f old = overwrite ? v16f{} : load16(dinp + i);
    store16(dinp + i, old + gelu_grad_lanes<v16f, v16i>(load16(inp + i)) * load16(dout + i));
  }
  for (; i + 8 <= i1; i += 8) {
    const v8f old = overwrite ? v8f{} : load8(dinp + i);
    store8(dinp + i, old + gelu_grad8(load8(inp + i)) * load8(dout + i));
  }
  const int64_t n = i1 - i;
  if (n > 0) {
    const v8f old = overwrite ? v8f{} : load8n(dinp + i, n);
    store8n(dinp + i, old + gelu_grad8(load8n(inp + i, n)) * load8n(dout + i, n), n);
  }
}

// Rows [r0, r1) of c_fc's gradient: g = GELU'(inp) * dout, rounded into dinp, and added row by
// row into part[OC] (which the caller zeroed).
ZOE_SIMD_CLONES void gelu_backward_bf16_rows(uint16_t* dinp, float* part, const uint16_t* inp, const float* dout,
                                             int64_t r0, int64_t r1, int64_t OC) {
  float buf[kBuf];
  for (int64_t r = r0; r < r1; r++)
    for (int64_t j = 0; j < OC; j += kBuf) {
      const int64_t n = std::min(kBuf, OC - j), at = r * OC + j;
      detail::widen_range(buf, inp + at, n);
      gelu_backward_range(buf, buf, dout + at, 0, n, /*overwrite=*/true);
      detail::round_range(dinp + at, buf, n);
      float* p = part + j;
      for (int64_t k = 0; k < n; k++) p[k] += buf[k];
    }
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t N) {
  detail::parallel_range(N, kGrain,
                         [&](int64_t i0, int64_t i1) { gelu_forward_range(out, inp, i0, i1); });
}

void gelu_forward_bf16(uint16_t* out, const uint16_t* inp, int64_t N) {
  detail::parallel_range(N, kGrain, [&](int64_t i0, int64_t i1) { gelu_forward_bf16_range(out, inp, i0, i1); });
}

// One pass over c_fc's output gradient for all three: GELU's gradient, its rounding and the bias
// sums (each task owns 64-row chunks, so it reads and writes whole rows; the chunks' sums are then
// added in chunk order, whatever the threads).
void gelu_backward_bf16(uint16_t* dinp, float* dbias, const uint16_t* inp, const float* dout, int N, int OC,
                        bool overwrite) {
  const int64_t chunks = detail::num_reduce_chunks(N);
  std::vector<float> parts(dbias ? size_t(chunks) * OC : 0);  // zeroed
  detail::parallel_range(chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> unused;  // the sums where no dbias is asked for
    for (int64_t c = c0; c < c1; c++) {
      float* part = dbias ? parts.data() + c * OC : (unused.assign(OC, 0.f), unused.data());
      const int64_t r0 = c * detail::kReduceChunkRows;
      gelu_backward_bf16_rows(dinp, part, inp, dout, r0, std::min<int64_t>(N, r0 + detail::kReduceChunkRows), OC);
    }
  });
  if (!dbias) return;
  detail::parallel_range(OC, 256, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; o++) {
      float s = 0.f;
      for (int64_t c = 0; c < chunks; c++) s += parts[c * OC + o];
      dbias[o] = overwrite ? s : dbias[o] + s;
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, bool overwrite) {
  detail::parallel_range(N, kGrain, [&](int64_t i0, int64_t i1) {
    gelu_backward_range(dinp, inp, dout, i0, i1, overwrite);
  });
}

}  // namespace zoe::gpt2

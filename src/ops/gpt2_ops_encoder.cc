// Token + position embedding.
#include "ops/gpt2_ops.h"
#include "ops/gpt2_ops_util.h"
#include "zoe/dtype.h"

namespace zoe::gpt2 {

namespace {

float widen(float x) { return x; }
float widen(uint16_t x) { return bf16_to_f32(x); }

// W: float or uint16_t (bf16 bit patterns, the sum in fp32 as the fp32 path's).
template <class W>
void encoder_rows(float* out, const int32_t* inp, const W* wte, const W* wpe, int B, int T, int C) {
  detail::parallel_range(int64_t{B} * T, detail::row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      float* o = out + r * C;
      const W* te = wte + int64_t{inp[r]} * C;
      const W* pe = wpe + (r % T) * C;
      for (int c = 0; c < C; c++) o[c] = widen(te[c]) + widen(pe[c]);
    }
  });
}

}  // namespace

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C) {
  encoder_rows(out, inp, wte, wpe, B, T, C);
}

void encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe, int B, int T,
                          int C) {
  encoder_rows(out, inp, wte, wpe, B, T, C);
}

// Rows of dwte collide when a token repeats, so the work is split by channel instead: each
// task owns a slice of channels of dwte and dwpe and walks all positions in order.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                      int T, int C) {
  const int64_t BT = int64_t{B} * T;
  detail::parallel_range(C, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < BT; r++) {
      const float* d = dout + r * C;
      if (dwte) {
        float* g = dwte + int64_t{inp[r]} * C;
        for (int64_t c = c0; c < c1; c++) g[c] += d[c];
      }
      if (dwpe) {
        float* g = dwpe + (r % T) * C;
        for (int64_t c = c0; c < c1; c++) g[c] += d[c];
      }
    }
  });
}

}  // namespace zoe::gpt2

// Plain-loop reference of the GPT-2 ops, templated on the real type (tests use double).
// Textbook formulas, no threads, no BLAS: the fp32 ops in gpt2_ops.h are checked against these,
// and these against finite differences. Same buffer meanings and += rule for gradients as
// gpt2_ops.h, except attention, which keeps the full attention matrix att [B,NH,T,T].
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace zoe::gpt2::ref {

template <class R>
void encoder_forward(R* out, const int32_t* inp, const R* wte, const R* wpe, int B, int T, int C) {
  for (int64_t r = 0; r < int64_t{B} * T; r++)
    for (int c = 0; c < C; c++) out[r * C + c] = wte[int64_t{inp[r]} * C + c] + wpe[(r % T) * C + c];
}
template <class R>
void encoder_backward(R* dwte, R* dwpe, const R* dout, const int32_t* inp, int B, int T, int C) {
  for (int64_t r = 0; r < int64_t{B} * T; r++)
    for (int c = 0; c < C; c++) {
      dwte[int64_t{inp[r]} * C + c] += dout[r * C + c];
      dwpe[(r % T) * C + c] += dout[r * C + c];
    }
}

template <class R>
void layernorm_forward(R* out, R* mean, R* rstd, const R* inp, const R* w, const R* b, int N,
                       int C) {
  for (int64_t r = 0; r < N; r++) {
    const R* x = inp + r * C;
    R m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    R s = 1 / std::sqrt(v / C + R(1e-5));
    for (int c = 0; c < C; c++) out[r * C + c] = (x[c] - m) * s * w[c] + b[c];
    mean[r] = m;
    rstd[r] = s;
  }
}
template <class R>
void layernorm_backward(R* dinp, R* dw, R* db, const R* dout, const R* inp, const R* w,
                        const R* mean, const R* rstd, int N, int C) {
  for (int64_t r = 0; r < N; r++) {
    const R* x = inp + r * C;
    const R* d = dout + r * C;
    std::vector<R> xhat(C), dn(C);
    R a = 0, bsum = 0;
    for (int c = 0; c < C; c++) {
      xhat[c] = (x[c] - mean[r]) * rstd[r];
      dn[c] = d[c] * w[c];
      a += dn[c];
      bsum += dn[c] * xhat[c];
      dw[c] += d[c] * xhat[c];
      db[c] += d[c];
    }
    for (int c = 0; c < C; c++) dinp[r * C + c] += rstd[r] * (dn[c] - a / C - xhat[c] * bsum / C);
  }
}

// W is [C,OC] (Conv1D), or [OC,C] when w_t (the tied LM head).
template <class R>
void matmul_forward(R* out, const R* inp, const R* W, const R* bias, int N, int C, int OC,
                    bool w_t = false) {
  for (int64_t r = 0; r < N; r++)
    for (int o = 0; o < OC; o++) {
      R acc = bias ? bias[o] : R(0);
      for (int c = 0; c < C; c++)
        acc += inp[r * C + c] * (w_t ? W[int64_t{o} * C + c] : W[int64_t{c} * OC + o]);
      out[r * OC + o] = acc;
    }
}
template <class R>
void matmul_backward(R* dinp, R* dW, R* dbias, const R* dout, const R* inp, const R* W, int N,
                     int C, int OC, bool w_t = false) {
  for (int64_t r = 0; r < N; r++)
    for (int o = 0; o < OC; o++) {
      const R g = dout[r * OC + o];
      if (dbias) dbias[o] += g;
      for (int c = 0; c < C; c++) {
        const int64_t wi = w_t ? int64_t{o} * C + c : int64_t{c} * OC + o;
        dinp[r * C + c] += g * W[wi];
        dW[wi] += g * inp[r * C + c];
      }
    }
}

// att [B,NH,T,T]: softmax probabilities (zero above the diagonal).
template <class R>
void attention_forward(R* out, R* att, const R* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const R scale = 1 / std::sqrt(R(hs));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const R* q = qkv + (int64_t{b} * T + i) * 3 * C + h * hs;
        R* a = att + ((int64_t{b} * NH + h) * T + i) * T;
        R m = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
          const R* k = qkv + (int64_t{b} * T + j) * 3 * C + C + h * hs;
          R s = 0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          a[j] = s * scale;
          m = std::max(m, a[j]);
        }
        for (int j = 0; j < T; j++) a[j] = j <= i ? std::exp(a[j] - m) : R(0);
        for (int j = 0; j <= i; j++) sum += a[j];
        for (int j = 0; j <= i; j++) a[j] /= sum;
        R* o = out + (int64_t{b} * T + i) * C + h * hs;
        for (int d = 0; d < hs; d++) {
          R acc = 0;
          for (int j = 0; j <= i; j++) acc += a[j] * qkv[(int64_t{b} * T + j) * 3 * C + 2 * C + h * hs + d];
          o[d] = acc;
        }
      }
}
template <class R>
void attention_backward(R* dqkv, const R* dout, const R* qkv, const R* att, int B, int T, int C,
                        int NH) {
  const int hs = C / NH;
  const R scale = 1 / std::sqrt(R(hs));
  std::vector<R> datt(T), dpre(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const int64_t qi = (int64_t{b} * T + i) * 3 * C + h * hs;
        const R* a = att + ((int64_t{b} * NH + h) * T + i) * T;
        const R* g = dout + (int64_t{b} * T + i) * C + h * hs;
        for (int j = 0; j <= i; j++) {  // out = att v
          const int64_t vj = (int64_t{b} * T + j) * 3 * C + 2 * C + h * hs;
          datt[j] = 0;
          for (int d = 0; d < hs; d++) {
            datt[j] += g[d] * qkv[vj + d];
            dqkv[vj + d] += a[j] * g[d];
          }
        }
        for (int j = 0; j <= i; j++) {  // softmax: d pre_j = sum_k a_k (delta_jk - a_j) datt_k
          dpre[j] = 0;
          for (int k = 0; k <= i; k++) dpre[j] += a[k] * ((j == k) - a[j]) * datt[k];
        }
        for (int j = 0; j <= i; j++) {  // pre = scale q.k
          const int64_t kj = (int64_t{b} * T + j) * 3 * C + C + h * hs;
          for (int d = 0; d < hs; d++) {
            dqkv[qi + d] += dpre[j] * scale * qkv[kj + d];
            dqkv[kj + d] += dpre[j] * scale * qkv[qi + d];
          }
        }
      }
}

template <class R>
void gelu_forward(R* out, const R* inp, int64_t N) {
  const R s = std::sqrt(R(2) / R(M_PI));
  for (int64_t i = 0; i < N; i++) {
    R x = inp[i];
    out[i] = R(0.5) * x * (1 + std::tanh(s * (x + R(0.044715) * x * x * x)));
  }
}
template <class R>
void gelu_backward(R* dinp, const R* inp, const R* dout, int64_t N) {
  const R s = std::sqrt(R(2) / R(M_PI));
  for (int64_t i = 0; i < N; i++) {
    R x = inp[i];
    R u = s * (x + R(0.044715) * x * x * x);
    R sech = 1 / std::cosh(u);
    R grad = R(0.5) * (1 + std::tanh(u)) + R(0.5) * x * sech * sech * s * (1 + 3 * R(0.044715) * x * x);
    dinp[i] += grad * dout[i];
  }
}

template <class R>
void residual_forward(R* out, const R* a, const R* b, int64_t N) {
  for (int64_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}
template <class R>
void residual_backward(R* da, R* db, const R* dout, int64_t N) {
  for (int64_t i = 0; i < N; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// Returns the mean loss; dlogits (if non-null) overwritten with (softmax - onehot) * dscale.
template <class R>
R crossentropy_forward_backward(R* dlogits, const R* logits, const int32_t* targets, int N, int V,
                                R dscale) {
  R total = 0;
  for (int64_t r = 0; r < N; r++) {
    const R* l = logits + r * V;
    R m = l[0], sum = 0;
    for (int v = 1; v < V; v++) m = std::max(m, l[v]);
    for (int v = 0; v < V; v++) sum += std::exp(l[v] - m);
    total += std::log(sum) + m - l[targets[r]];
    if (!dlogits) continue;
    for (int v = 0; v < V; v++)
      dlogits[r * V + v] = (std::exp(l[v] - m) / sum - (v == targets[r])) * dscale;
  }
  return total / N;
}

}  // namespace zoe::gpt2::ref

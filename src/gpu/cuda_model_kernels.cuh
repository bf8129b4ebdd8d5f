// The GPT-2 kernels other than attention and the GEMMs, fp32, one idea per kernel. Semantics are
// those of the CPU reference (ops/gpt2_ops_*.cc); the launch code is in cuda_model_ops.cu.
//
// Determinism: no kernel uses atomics. Each output element is written by exactly one thread, and
// every sum runs in an order fixed by the shapes alone (loop order, then fixed butterfly / tree
// reductions), so reruns give the same bits.
#pragma once
#include <cstdint>

#include "gpu/cuda_kernel_util.cuh"
#include "gpu/dtype_bits.h"

namespace zoe::gpu::kernels {

// ---- elementwise --------------------------------------------------------------------------------

// out[r, c] = row[c] for the n = rows * cols elements of out (seeds a GEMM output with its bias).
__global__ void fill_rows_kernel(float* out, const float* row, int64_t n, int cols) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = row[i % cols];
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// out may alias inp: each element is read, then written, by the same thread. In: float, or
// uint16_t (bf16 compute: c_fc's output as its product rounded it).
template <class Out, class In>
__global__ void gelu_forward_kernel(Out* out, const In* inp, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float x = widen(inp[i]);
    store_out(out + i, 0.5f * x * (1.f + tanhf(kGeluScale * (x + kGeluCube * x * x * x))));
  }
}

// GELU'(x), as the CPU: d/dx tanh(u) = (1 - tanh^2(u)) du/dx, no cosh, which overflows for large u.
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(kGeluScale * (x + kGeluCube * x * x * x));
  const float dth = (1.f - th * th) * kGeluScale * (1.f + 3.f * kGeluCube * x * x);
  return 0.5f * (1.f + th) + 0.5f * x * dth;
}

// overwrite: dinp's old contents are not read.
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n, bool overwrite) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float g = gelu_grad(inp[i]) * dout[i];
    dinp[i] = overwrite ? g : dinp[i] + g;
  }
}

// bf16 compute: dinp = GELU'(inp) * dout rounded to bf16 (c_fc's products read nothing else).
__global__ void gelu_backward_bf16_kernel(uint16_t* dinp, const uint16_t* inp, const float* dout, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dinp[i] = bits::f32_to_bf16(gelu_grad(widen(inp[i])) * dout[i]);
}

// out may alias either input.
__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = a[i] + b[i];
}

// ---- encoder ------------------------------------------------------------------------------------

// W: float, or uint16_t (bf16 bit patterns) in bf16 compute; the sum in fp32 either way.
template <class W>
__global__ void encoder_forward_kernel(float* out, const int32_t* inp, const W* wte, const W* wpe, int64_t BT, int T,
                                       int C) {
  const int64_t n = BT * C;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t r = i / C;
    const int64_t c = i - r * C;
    out[i] = widen(wte[static_cast<int64_t>(inp[r]) * C + c]) + widen(wpe[(r % T) * C + c]);
  }
}

// dst[i] = src[i] rounded to bf16 (the operands of bf16 compute's products).
__global__ void round_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = bits::f32_to_bf16(src[i]);
}

// dwpe[t, c] += sum over b (in order) of dout[b, t, c]: one thread per element of dwpe.
__global__ void encoder_dwpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(T) * C;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    float s = 0.f;
    for (int b = 0; b < B; b++) s += dout[b * n + i];
    dwpe[i] += s;
  }
}

// The token gradient dwte[inp[r]] += dout[r] collides where a token repeats. Instead of atomics,
// positions holding the same token are chained in position order: next[r] is the next position
// with r's token (-1 at the end) and head[r] says r is the token's first position. Then one block
// per head walks its chain (encoder_dwte_kernel), so every row of dwte is summed by one block,
// in position order: deterministic, no sort, no atomics. Building the chains compares every
// position with every other (O(BT^2) integer compares through shared-memory tiles: ~4M at
// BT = 2048, still well under a millisecond at BT = 16K).
constexpr int kLinkThreads = 256;
__global__ void encoder_links_kernel(int32_t* next, int32_t* head, const int32_t* inp, int BT) {
  __shared__ int32_t tile[kLinkThreads];
  const int r = blockIdx.x * kLinkThreads + threadIdx.x;
  const int32_t tok = r < BT ? inp[r] : 0;
  int32_t nxt = -1, is_head = 1;
  for (int base = 0; base < BT; base += kLinkThreads) {
    const int n = BT - base < kLinkThreads ? BT - base : kLinkThreads;
    if (static_cast<int>(threadIdx.x) < n) tile[threadIdx.x] = inp[base + threadIdx.x];
    __syncthreads();
    if (r < BT) {
      for (int k = 0; k < n; k++) {
        if (tile[k] != tok) continue;
        const int j = base + k;
        if (j < r) is_head = 0;
        else if (j > r && nxt < 0) nxt = j;  // tiles and k ascend: the first hit is the nearest
      }
    }
    __syncthreads();
  }
  if (r < BT) {
    next[r] = nxt;
    head[r] = is_head;
  }
}

// One block per position; only heads work: dwte[token] += sum of dout over the token's chain.
__global__ void encoder_dwte_kernel(float* dwte, const float* dout, const int32_t* inp, const int32_t* next,
                                    const int32_t* head, int C) {
  const int r = blockIdx.x;
  if (!head[r]) return;
  float* g = dwte + static_cast<int64_t>(inp[r]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.f;
    for (int p = r; p >= 0; p = next[p]) s += dout[static_cast<int64_t>(p) * C + c];
    g[c] += s;
  }
}

// ---- layernorm ----------------------------------------------------------------------------------

// One warp per row (kThreads / 32 rows per block). Two passes, mean then squared deviations, as
// the CPU: no cancellation for rows with a large mean. Biased variance, eps 1e-5.
template <class Out>
__global__ void layernorm_forward_kernel(Out* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // the whole warp leaves together: the shuffles below see every lane
  const float* x = inp + static_cast<int64_t>(row) * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float r = 1.f / sqrtf(warp_sum(v) / C + 1e-5f);
  Out* o = out + static_cast<int64_t>(row) * C;
  for (int c = lane; c < C; c += 32) store_out(o + c, (x[c] - m) * r * w[c] + b[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w; warp per row.
__global__ void layernorm_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                      const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const int64_t off = static_cast<int64_t>(row) * C;
  const float* x = inp + off;
  const float* d = dout + off;
  const float m = mean[row], s = rstd[row];
  float a = 0.f, bsum = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (x[c] - m) * s, dn = d[c] * w[c];
    a += dn;
    bsum += dn * xhat;
  }
  a = warp_sum(a) / C;
  bsum = warp_sum(bsum) / C;
  float* g = dinp + off;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (x[c] - m) * s;
    g[c] += s * (d[c] * w[c] - a - xhat * bsum);
  }
}

// ---- column sums (dbias, layernorm dw / db) -----------------------------------------------------

// Values summed down the columns: Rows reads a row-major matrix (cuda_kernel_util.cuh), GeluGrad
// makes GELU's gradient, LnDw the layernorm weight gradient's terms dout * xhat.
// GELU's gradient as gelu_backward_bf16_kernel makes it, before its rounding: c_fc's dbias.
struct GeluGrad {
  const uint16_t* inp;
  const float* dout;
  int ld;
  __device__ float operator()(int64_t r, int c) const {
    const int64_t i = r * ld + c;
    return gelu_grad(widen(inp[i])) * dout[i];
  }
};
struct LnDw {
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  int C;
  __device__ float operator()(int64_t r, int c) const {
    const int64_t i = r * C + c;
    return dout[i] * ((inp[i] - mean[r]) * rstd[r]);
  }
};

// Deterministic column sums in two steps, no atomics. Block (x, y) sums the 32 columns
// [32x, 32x + 32) over rows [y * chunk_rows, (y + 1) * chunk_rows): each of its 8 warps takes every
// 8th row (a warp reads 32 adjacent floats of a row: coalesced), then the 8 partials are added in
// warp order. With one chunk the block adds straight into out (accumulate = 1); otherwise it
// writes partial row y of out ([chunks][ncols]) and column_finish_kernel adds the chunks in order.
constexpr int kColThreads = 256;  // 32 columns x 8 row phases
template <class Val>
__global__ void column_partial_kernel(float* out, int accumulate, Val val, int64_t N, int ncols,
                                      int64_t chunk_rows) {
  __shared__ float part[kColThreads / 32][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int c = blockIdx.x * 32 + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
  float acc = 0.f;
  if (c < ncols)
    for (int64_t r = r0 + ty; r < r1; r += kColThreads / 32) acc += val(r, c);
  part[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < ncols) {
    float s = part[0][tx];
    for (int k = 1; k < kColThreads / 32; k++) s += part[k][tx];
    float* dst = out + static_cast<int64_t>(blockIdx.y) * ncols + c;
    *dst = accumulate ? *dst + s : s;
  }
}

// dst[c] += sum over chunks k (in order) of part[k][c].
__global__ void column_finish_kernel(float* dst, const float* part, int64_t chunks, int ncols) {
  for (int64_t c = global_thread(); c < ncols; c += grid_threads()) {
    float s = 0.f;
    for (int64_t k = 0; k < chunks; k++) s += part[k * ncols + c];
    dst[c] += s;
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------

// One block per position: max, then the sum of exps (two passes over the row, as the CPU), the
// loss in double into losses[row], and with dlogits (which may alias logits) the gradient
// (softmax - onehot(target)) * dscale. Writes start only after every thread has read the whole row
// (the barriers inside block_sum), and each thread then rewrites only elements it reads itself.
constexpr int kCeThreads = 512;
// L, D: float, or uint16_t (bf16 logits read widened; dlogits written rounded).
template <class L, class D>
__global__ void crossentropy_rows_kernel(double* losses, D* dlogits, const L* logits, const int32_t* targets, int V,
                                         float dscale) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const L* l = logits + row * V;
  const int32_t t = targets[row];
  const bool t_ok = t >= 0 && t < V;
  const float lt = t_ok ? widen(l[t]) : NAN;  // read before any thread can overwrite it in place
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, widen(l[v]));
  mx = block_max(mx, red);
  float s = 0.f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(widen(l[v]) - mx);
  s = block_sum(s, red);
  if (threadIdx.x == 0) losses[row] = log(static_cast<double>(s)) + mx - lt;
  if (!dlogits) return;
  D* d = dlogits + row * V;
  const float k = static_cast<float>(static_cast<double>(dscale) / s);
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float e = expf(widen(l[v]) - mx) * k;
    store_out(d + v, v == t ? e - dscale : e);
  }
}

// *out = mean of x[0, n) summed in double in a fixed order (0 when n == 0). One block.
constexpr int kMeanThreads = 1024;
__global__ void mean_kernel(float* out, const double* x, int n) {
  __shared__ double red[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *out = n > 0 ? static_cast<float>(s / n) : 0.f;
}

}  // namespace zoe::gpu::kernels

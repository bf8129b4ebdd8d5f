// The emulated tensor-core product (tools/cuda_emu: mma.sync m16n8k16 bf16) and src/gpu's fragment
// helpers (gpu/cuda_mma.cuh) against a plain product, one warp (cuda_emu.h forced in, as for
// src/gpu's kernels; tests/CMakeLists.txt).
//   mma_fragments_emu --product      D = A B, and F = (A E) B with A E's accumulators rounded and
//                                    taken as A in place (acc_as_a); exact on small integers
//   mma_fragments_emu --lane-exits   one lane of the warp returns before the mma: aborts
//   mma_fragments_emu --lane-shuffles one lane shuffles while the others mma: aborts
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda_mma.cuh"

namespace {

namespace k = zoe::gpu::kernels;

constexpr int kLd = 24;  // a row stride with padding, as the attention's tiles have

uint16_t bf16(float f) {  // exact for the small integers used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// A [16][kLd] (16 x 16 used), Bt [8][kLd] (B's 8 columns as rows), Et [16][kLd] (E's 16 columns
// as rows) -> D [16][8] = A B, F [16][8] = (A E) B. mode 1 and 2: lane 5 leaves the warp's mma.
__global__ void product_kernel(const uint16_t* A, const uint16_t* Bt, const uint16_t* Et, float* D, float* F,
                               int mode) {
  const int lane = threadIdx.x;
  if (mode == 1 && lane == 5) return;
  if (mode == 2 && lane == 5) {
    (void)__shfl_xor_sync(k::kFullMask, 1.f, 1);
    return;
  }
  uint32_t a[4], b[2];
  k::load_a(a, A, kLd, 0, 0);
  k::load_b(b, Bt, kLd, 0, 0);
  float d[4] = {};
  k::mma_bf16(d, a, b);
  const int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; i++) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
  // Two n-tiles of A E (16 x 16) as accumulators, then their bf16 as A against B again.
  float left[4] = {}, right[4] = {};
  k::load_b(b, Et, kLd, 0, 0);
  k::mma_bf16(left, a, b);
  k::load_b(b, Et, kLd, 8, 0);
  k::mma_bf16(right, a, b);
  uint32_t ae[4];
  k::acc_as_a(ae, left, right);
  k::load_b(b, Bt, kLd, 0, 0);
  float f[4] = {};
  k::mma_bf16(f, ae, b);
  for (int i = 0; i < 4; i++) F[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = f[i];
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(e));
  return false;
}

template <class T>
T* upload(const std::vector<T>& v) {
  void* p = nullptr;
  if (!ok(cudaMalloc(&p, sizeof(T) * v.size()), "cudaMalloc") ||
      !ok(cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), "cudaMemcpy"))
    return nullptr;
  return static_cast<T*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int m = mode == "--product" ? 0 : mode == "--lane-exits" ? 1 : mode == "--lane-shuffles" ? 2 : -1;
  if (m < 0) return std::fprintf(stderr, "usage: mma_fragments_emu --product|--lane-exits|--lane-shuffles\n"), 2;
  // Small integers: every product and sum is exact in fp32 (and the intermediate in bf16), so the
  // comparison is exact whatever order the sums take.
  std::vector<float> a(16 * 16), b(16 * 8), e(16 * 16);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) a[r * 16 + c] = static_cast<float>((r * 7 + c * 3) % 5 - 2);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 8; c++) b[r * 8 + c] = static_cast<float>((r * 5 + c * 11) % 7 - 3);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) e[r * 16 + c] = static_cast<float>((r + 2 * c) % 3 - 1);
  std::vector<uint16_t> A(16 * kLd, 0), Bt(8 * kLd, 0), Et(16 * kLd, 0);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) A[r * kLd + c] = bf16(a[r * 16 + c]);
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 8; n++) Bt[n * kLd + k] = bf16(b[k * 8 + n]);
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 16; n++) Et[n * kLd + k] = bf16(e[k * 16 + n]);
  uint16_t *dA = upload(A), *dB = upload(Bt), *dE = upload(Et);
  float* dD = upload(std::vector<float>(16 * 8, -1.f));
  float* dF = upload(std::vector<float>(16 * 8, -1.f));
  if (!dA || !dB || !dE || !dD || !dF) return 1;
  ZOE_LAUNCH(1, 32, 0, nullptr, product_kernel)(dA, dB, dE, dD, dF, m);
  if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  std::vector<float> D(16 * 8), F(16 * 8);
  if (!ok(cudaMemcpy(D.data(), dD, sizeof(float) * D.size(), cudaMemcpyDeviceToHost), "cudaMemcpy") ||
      !ok(cudaMemcpy(F.data(), dF, sizeof(float) * F.size(), cudaMemcpyDeviceToHost), "cudaMemcpy"))
    return 1;
  int wrong = 0;
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 8; n++) {
      float want = 0.f, want_f = 0.f;
      for (int k = 0; k < 16; k++) want += a[r * 16 + k] * b[k * 8 + n];
      for (int j = 0; j < 16; j++) {
        float ae = 0.f;
        for (int k = 0; k < 16; k++) ae += a[r * 16 + k] * e[k * 16 + j];
        want_f += ae * b[j * 8 + n];
      }
      wrong += D[r * 8 + n] != want;
      wrong += F[r * 8 + n] != want_f;
    }
  std::printf("mma_fragments_emu %s: %d of %d elements differ from the plain product\n", mode.c_str(), wrong,
              2 * 16 * 8);
  return wrong == 0 ? 0 : 1;
}

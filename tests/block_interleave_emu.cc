// The emulated GPU (tools/cuda_emu) runs several blocks of a launch at once, as a GPU does: their
// rounds (barrier to barrier) interleave in a seeded order, and each block keeps its own static
// __shared__ variables although the emulation's are C++ statics at one address. Built like the
// src/gpu kernels (cuda_emu.h forced in, the race check's hooks compiled in; tests/CMakeLists.txt).
//   block_interleave_emu --expect-interleaved   (the random schedule: some block starts before an
//                                                earlier one ends; every block read its own value)
//   block_interleave_emu --expect-in-order      (CUDA_EMU_SCHEDULE=ascending: one block at a time)
#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int kBlocks = 16, kThreads = 64, kRounds = 4;

// Each block's thread 0 takes a ticket as the block starts and after its last barrier; between,
// every round writes the block's index into a static __shared__ variable, passes a barrier, and
// every thread reads it back (a block that saw another's value counts a mismatch).
__global__ void interleave_kernel(unsigned* tickets, unsigned* clock, unsigned* mismatches) {
  __shared__ int mine;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) tickets[2 * b] = atomicAdd(clock, 1u);
  for (int r = 0; r < kRounds; r++) {
    __syncthreads();
    if (threadIdx.x == 0) mine = b * 100 + r;
    __syncthreads();
    if (mine != b * 100 + r) atomicAdd(mismatches, 1u);
  }
  __syncthreads();
  if (threadIdx.x == 0) tickets[2 * b + 1] = atomicAdd(clock, 1u);
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "--expect-interleaved" && mode != "--expect-in-order")
    return std::fprintf(stderr, "usage: block_interleave_emu --expect-interleaved|--expect-in-order\n"), 2;
  unsigned *tickets = nullptr, *counters = nullptr;
  if (!ok(cudaMalloc(reinterpret_cast<void**>(&tickets), sizeof(unsigned) * 2 * kBlocks), "cudaMalloc") ||
      !ok(cudaMalloc(reinterpret_cast<void**>(&counters), sizeof(unsigned) * 2), "cudaMalloc") ||
      !ok(cudaMemset(counters, 0, sizeof(unsigned) * 2), "cudaMemset"))
    return 1;
  ZOE_LAUNCH(kBlocks, kThreads, 0, nullptr, interleave_kernel)(tickets, counters, counters + 1);
  if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  std::vector<unsigned> t(2 * kBlocks), c(2);
  if (!ok(cudaMemcpy(t.data(), tickets, sizeof(unsigned) * t.size(), cudaMemcpyDeviceToHost), "cudaMemcpy") ||
      !ok(cudaMemcpy(c.data(), counters, sizeof(unsigned) * 2, cudaMemcpyDeviceToHost), "cudaMemcpy"))
    return 1;
  int overlaps = 0;  // blocks that started before the block before them ended
  for (int b = 1; b < kBlocks; b++) overlaps += t[2 * b] < t[2 * (b - 1) + 1];
  std::printf("block_interleave_emu: %d of %d blocks started before the previous one ended; %u reads of "
              "another block's __shared__\n", overlaps, kBlocks - 1, c[1]);
  if (c[1] != 0) return 1;
  const bool interleaved = overlaps > 0;
  if (interleaved != (mode == "--expect-interleaved")) return 1;
  std::printf("block_interleave_emu %s: as expected\n", mode.c_str());
  return 0;
}

// The emulated GPU (tools/cuda_emu) reports pinned host memory that changes while a queued copy
// has yet to read or write it: on a GPU the copy reads (or writes) it when it runs, not at the
// call, so host code that refills a staging buffer before waiting for the copy uploads the wrong
// bytes, silently. The stream is kept busy first (queued memsets, each delayed by
// CUDA_EMU_DELAY), so the host's write lands before the copy runs. Modes:
//   --source-early       write the pinned source of a host-to-device copy before it ran (aborts)
//   --destination-early  write the pinned destination of a device-to-host copy before it ran (aborts)
//   --memset-early       write pinned memory that a queued cudaMemsetAsync zeroes before it ran (aborts)
//   --after-wait         the same writes after cudaStreamSynchronize (runs through)
//   --read-early         read the pinned destination of a device-to-host copy before it ran: the
//                        emulation poisoned it at the call (0xff), as a GPU guarantees nothing there
//                        until the copy is waited for (prints the bytes read before and after)
// Run by ctest (tests/CMakeLists.txt), which checks what each prints.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(e));
  return false;
}

// Queues work ahead of the copy so that it runs late.
bool keep_busy(cudaStream_t s, void* scratch, size_t bytes) {
  for (int i = 0; i < 20; i++)
    if (!ok(cudaMemsetAsync(scratch, i, bytes, s), "cudaMemsetAsync")) return false;
  return true;
}

int run(const std::string& mode) {
  constexpr size_t kBytes = 4096;
  char* pinned = nullptr;
  void *dev = nullptr, *scratch = nullptr;
  cudaStream_t s;
  if (!ok(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kBytes, cudaHostAllocDefault), "cudaHostAlloc") ||
      !ok(cudaMalloc(&dev, kBytes), "cudaMalloc") || !ok(cudaMalloc(&scratch, kBytes), "cudaMalloc") ||
      !ok(cudaStreamCreate(&s), "cudaStreamCreate"))
    return 1;
  std::memset(pinned, 1, kBytes);
  if (mode == "--read-early") {  // the device holds 2s; the host reads the download's bytes too soon
    if (!ok(cudaMemset(dev, 2, kBytes), "cudaMemset") || !keep_busy(s, scratch, kBytes) ||
        !ok(cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync"))
      return 1;
    const unsigned early = static_cast<unsigned char>(pinned[100]);
    if (!ok(cudaStreamSynchronize(s), "cudaStreamSynchronize")) return 1;
    std::printf("pinned_guard_emu --read-early: read %u before the copy ran, %u after\n", early,
                static_cast<unsigned char>(pinned[100]));
    return 0;
  }
  const bool upload = mode != "--destination-early";
  for (int round = 0; round < 2; round++) {  // --after-wait: an upload and a download
    const bool up = mode == "--after-wait" ? round == 0 : upload;
    if (!keep_busy(s, scratch, kBytes)) return 1;
    cudaError_t e = mode == "--memset-early" ? cudaMemsetAsync(pinned, 0, kBytes, s)
                    : up ? cudaMemcpyAsync(dev, pinned, kBytes, cudaMemcpyHostToDevice, s)
                         : cudaMemcpyAsync(pinned, dev, kBytes, cudaMemcpyDeviceToHost, s);
    if (!ok(e, "the queued operation")) return 1;
    if (mode == "--after-wait" && !ok(cudaStreamSynchronize(s), "cudaStreamSynchronize")) return 1;
    pinned[100] = 7;  // the bug (unless waited for): the buffer is refilled while the copy is queued
    if (!ok(cudaStreamSynchronize(s), "cudaStreamSynchronize")) return 1;
    if (mode != "--after-wait") break;
  }
  std::printf("pinned_guard_emu %s: ran through\n", mode.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "--source-early" && mode != "--destination-early" && mode != "--memset-early" && mode != "--after-wait" &&
      mode != "--read-early")
    return std::fprintf(stderr, "usage: pinned_guard_emu --source-early|--destination-early|--memset-early|--after-wait|"
                                "--read-early\n"), 2;
  return run(mode);
}

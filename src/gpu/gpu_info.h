// What the CUDA runtime sees. Safe to call where no driver is installed.
#pragma once
#include <string>
#include <vector>

namespace zoe::gpu {
struct GpuInfo {
  int index;
  std::string name;
  size_t total_bytes;
  int sm_major, sm_minor;
};
// Empty (and *why set) when there is no driver or no GPU; never throws or aborts.
std::vector<GpuInfo> list_gpus(std::string* why);
// GPU `index`'s free memory now (cudaMemGetInfo: what other processes and this one's context
// hold is not free); false, with *why set, when it cannot be read. Makes `index` current.
bool free_bytes(int index, size_t* free, std::string* why);
// Launches a one-thread kernel and checks its result: proves the toolkit, arch and driver work.
bool smoke_kernel(std::string* why);
}  // namespace zoe::gpu

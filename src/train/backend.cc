#include "train/backend.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpu/cpu_device.h"
#include "kernels/gemm.h"
#include "nvme/io_error.h"
#ifdef ZOE_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/gpu_info.h"
#include "gpu/nccl_comm.h"
#endif

namespace zoe {

namespace {

uint64_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

#ifdef ZOE_HAVE_CUDA
// This process's GPU: zoe.gpu, or its local rank modulo the GPUs visible. A zoe.gpu that is not
// visible is an error naming the key (with no GPU at all, make_cuda_device says so).
Result<int> gpu_index(const Config& c) {
  if (c.gpu < 0) return local_gpu_index();
  std::string why;
  const size_t visible = gpu::list_gpus(&why).size();
  if (visible > 0 && static_cast<size_t>(c.gpu) >= visible)
    return Status::Invalid(fmt::format("config key 'zoe.gpu': GPU {}, but {} GPU{} visible (CUDA_VISIBLE_DEVICES "
                                       "picks which; they are numbered from 0)",
                                       c.gpu, visible, visible == 1 ? " is" : "s are"));
  return c.gpu;
}
#endif

}  // namespace

// A launcher that starts several processes without MPI (torchrun, accelerate launch) says so in
// WORLD_SIZE; each process would be a one-rank zoe training alone: N replicas and no error.
Status check_launched_alone() {
  const char* ws = std::getenv("WORLD_SIZE");
  if (!ws || !*ws) return Status::Ok();
  char* end = nullptr;
  long n = std::strtol(ws, &end, 10);
  if (*end != '\0' || n <= 1) return Status::Ok();
  return Status::Invalid(fmt::format(
      "WORLD_SIZE={} (torchrun, accelerate launch or another launcher of {} processes) but no MPI launcher: zoe's "
      "ranks are MPI processes, so each of these would train alone; start them with `mpirun -np {} ...` instead",
      ws, n, n));
}

Result<std::unique_ptr<Comm>> make_comm() {
  if (launched_by_mpirun()) return make_mpi_comm();
  ZOE_RETURN_IF_ERROR(check_launched_alone());
  return make_self_comm();
}

Status resolve_device_budget(Config& c, Comm& control) {
  if (!c.device_memory_budget_auto) return Status::Ok();
  if (c.device != "cuda") {  // the CPU device's arena: 8 GiB
    c.device_memory_budget_auto = false;
    return Status::Ok();
  }
  // Every rank's GPU's free memory (0: no GPU, which make_backend reports; kUnread: a GPU whose
  // free memory cannot be read), and the least of them on every rank: one budget for the job, as
  // a budget in bytes is.
  constexpr uint64_t kUnread = UINT64_MAX, kNoSuchGpu = UINT64_MAX - 1;
  uint64_t mine = 0;
  std::string why;
  Status index_status;
#ifdef ZOE_HAVE_CUDA
  size_t free = 0;
  Result<int> index = gpu_index(c);
  if (!index.ok()) index_status = index.status(), mine = kNoSuchGpu;
  else if (!gpu::list_gpus(&why).empty()) mine = gpu::free_bytes(*index, &free, &why) ? free : kUnread;
#endif
  std::vector<uint64_t> all(control.size());
  ZOE_RETURN_IF_ERROR(control.all_gather_control(&mine, all.data(), sizeof mine));
  int least = -1;
  for (int r = 0; r < control.size(); ++r) {
    if (all[r] == kNoSuchGpu)  // every rank fails, its own reason or the first such rank's
      return mine == kNoSuchGpu
                 ? index_status
                 : Status::Invalid(fmt::format("config key 'zoe.gpu': {}, not a GPU rank {} sees", c.gpu, r));
    if (all[r] == kUnread)
      return Status::Invalid(fmt::format("config key 'zoe.device_memory_budget' \"auto\": rank {} cannot read its "
                                         "GPU's free memory{}: give a budget in bytes",
                                         r, r == control.rank() ? " (" + why + ")" : ""));
    if (all[r] > 0 && (least < 0 || all[r] < all[least])) least = r;
  }
  if (least < 0) return Status::Ok();  // no GPU: make_backend says so
  if (all[least] < kAutoDeviceMargin + kAutoDeviceLeast)
    return Status::Invalid(fmt::format(
        "config key 'zoe.device_memory_budget' \"auto\": rank {}'s GPU has {} free, under the {} that \"auto\" "
        "leaves for the CUDA context and NCCL plus 1 GiB for zoe: free the GPU or give a budget in bytes",
        least, bytes_text(all[least]), bytes_text(kAutoDeviceMargin)));
  c.device_memory_budget = all[least] - kAutoDeviceMargin;
  c.device_memory_budget_auto = false;
  return Status::Ok();
}

Result<Backend> make_backend(const Config& c, Comm& control) {
  Backend b;
  if (c.device == "cpu" || c.device == "cpu-strict") {
    auto dev = std::make_unique<CpuDevice>(c.device_memory_budget, c.host_memory_budget, c.device == "cpu-strict");
    if (int e = dev->arena_map_error())
      return Status::Invalid(fmt::format(
          "config key 'zoe.device_memory_budget': {} cannot be reserved as the CPU device's memory (mmap: {}); "
          "this machine has {} of memory: give a budget it can hold",
          bytes_text(c.device_memory_budget), std::strerror(e), bytes_text(physical_memory_bytes())));
    // The CPU device's model ops run the host GEMM paths: a bad ZOE_GEMM_* is an error now.
    for (GemmType t : {GemmType::kF32, GemmType::kBF16}) ZOE_RETURN_IF_ERROR(gemm_path(t).status());
    b.device = std::move(dev);
    return b;
  }
#ifdef ZOE_HAVE_CUDA
  ZOE_ASSIGN_OR_RETURN(const int index, gpu_index(c));
  ZOE_ASSIGN_OR_RETURN(b.device, make_cuda_device(index, c.device_memory_budget, c.host_memory_budget, c.allow_tf32));
  if (control.size() > 1) {
    ZOE_ASSIGN_OR_RETURN(b.tensor_comm, make_nccl_comm(control, static_cast<CudaDevice&>(*b.device),
                                                       c.nccl_reduce_scatter ? NcclComm::Sum::kNccl
                                                                             : NcclComm::Sum::kRankOrder));
  } else {
    // One rank (mpirun -np 1 too): the device's own copies and sums. MPI's would read and write
    // GPU memory from the host, unordered with the kernels that make it.
    b.tensor_comm = make_self_comm();
  }
  return b;
#else
  return Status::Invalid("config key 'zoe.device': \"cuda\" needs a build with CUDA (this zoe was built without "
                         "nvcc: reconfigure with -DZOE_CUDA=ON)");
#endif
}

}  // namespace zoe

#include "train/backend.h"

#include "cpu/cpu_device.h"
#ifdef ZOE_HAVE_CUDA
#include "gpu/cuda_device.h"
#include "gpu/nccl_comm.h"
#endif

namespace zoe {

Result<Backend> make_backend(const Config& c, Comm& control) {
  Backend b;
  if (c.device == "cpu" || c.device == "cpu-strict") {
    b.device = std::make_unique<CpuDevice>(c.device_memory_budget, c.host_memory_budget, c.device == "cpu-strict");
    return b;
  }
#ifdef ZOE_HAVE_CUDA
  ZOE_ASSIGN_OR_RETURN(b.device, make_cuda_device(local_gpu_index(), c.device_memory_budget, c.host_memory_budget));
  if (control.size() > 1) {
    ZOE_ASSIGN_OR_RETURN(b.tensor_comm, make_nccl_comm(control, static_cast<CudaDevice&>(*b.device)));
  }
  return b;
#else
  return Status::Invalid("config key 'zoe.device': \"cuda\" needs a build with CUDA (this zoe was built without "
                         "nvcc: reconfigure with -DZOE_CUDA=ON)");
#endif
}

}  // namespace zoe

// The backend a config names: the device and the communicator for its tensor traffic. The one
// place that knows the concrete backends; the trainer, the engine and the models see only
// Device and Comm.
#pragma once
#include <cstdint>
#include <memory>

#include "comm/comm.h"
#include "common/config.h"
#include "zoe/device.h"

namespace zoe {

struct Backend {
  std::unique_ptr<Device> device;
  // The tensor-traffic communicator paired with the device (cuda: NCCL, or the one-rank SelfComm
  // under mpirun -np 1 too); null when the control communicator (MPI, or the one-rank SelfComm)
  // carries the tensors too, as on the CPU device.
  std::unique_ptr<Comm> tensor_comm;
};

// zoe.device_memory_budget "auto" (the default) made bytes: on cuda the free memory of this rank's
// GPU less 3 GiB (the CUDA context, NCCL's and the libraries' own buffers: what the budget does
// not hold), on the CPU device 8 GiB. A GPU that cannot be read is left to make_backend to
// report. Call it before make_backend and before the config's budget is read.
// Collective over `control`: the least of the ranks' GPUs.
Status resolve_device_budget(Config& c, Comm& control);
// What "auto" leaves of a GPU's free memory, and the least free memory it takes.
inline constexpr uint64_t kAutoDeviceMargin = uint64_t{3} << 30, kAutoDeviceLeast = uint64_t{1} << 30;

// zoe.device: "cpu", "cpu-strict" (device memory untouchable outside Device calls) or "cuda"
// (zoe.gpu, by default the GPU of this rank's local index; NCCL between ranks). Without a GPU, or in a build without
// CUDA, "cuda" is an input error naming the key.
Result<Backend> make_backend(const Config& c, Comm& control);

// The control communicator of this process: MPI under mpirun (MPI initialised here), else the
// one-rank SelfComm.
Result<std::unique_ptr<Comm>> make_comm();

}  // namespace zoe

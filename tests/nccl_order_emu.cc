// Two ranks on the emulated GPU (tools/cuda_emu) issue NCCL calls through NcclComm: with
// `--swapped`, rank 1 issues them in the other order (reduce_scatter, then all_gather), which on
// real NCCL hangs or mixes data up; the emulation must abort naming both calls. Without it, the
// same order on both ranks runs through. Run by ctest under mpirun -np 2 (tests/CMakeLists.txt).
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "gpu/cuda_device.h"
#include "gpu/nccl_comm.h"

namespace zoe {
namespace {

int run(bool swapped) {
  auto mpi = make_mpi_comm();
  if (!mpi.ok()) return std::fprintf(stderr, "%s\n", mpi.status().message().c_str()), 1;
  Comm& control = *mpi.value();
  auto d = make_cuda_device(local_gpu_index(), size_t{64} << 20, size_t{16} << 20);
  if (!d.ok()) return std::fprintf(stderr, "%s\n", d.status().message().c_str()), 1;
  auto& dev = static_cast<CudaDevice&>(*d.value());
  auto c = make_nccl_comm(control, dev);
  if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().message().c_str()), 1;
  Comm& nccl = *c.value();
  const size_t n = 256;
  auto send = dev.alloc(n * 4 * control.size(), Tier::kDevice, Kind::kComm);
  auto recv = dev.alloc(n * 4 * control.size(), Tier::kDevice, Kind::kComm);
  if (!send.ok() || !recv.ok()) return 1;
  std::vector<float> ones(n * control.size(), 1.0f);
  if (!dev.upload(send->data, ones.data(), ones.size() * 4).ok()) return 1;
  auto gather = [&] { return nccl.all_gather(send->data, recv->data, n * 4); };
  auto reduce = [&] { return nccl.reduce_scatter(send->data, recv->data, n, DType::kF32); };
  Status a, b;
  if (swapped && control.rank() == 1) {
    a = reduce();
    b = gather();
  } else {
    a = gather();
    b = reduce();
  }
  if (!a.ok() || !b.ok() || !dev.synchronize().ok()) return std::fprintf(stderr, "a call failed\n"), 1;
  std::printf("rank %d: the ranks' NCCL calls agree\n", control.rank());
  nccl.set_device(nullptr);
  dev.free(*send);
  dev.free(*recv);
  return 0;
}

}  // namespace
}  // namespace zoe

int main(int argc, char** argv) { return zoe::run(argc > 1 && std::strcmp(argv[1], "--swapped") == 0); }

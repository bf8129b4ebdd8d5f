#!/usr/bin/env bash
# Issue 29's mutation checks: each mutation breaks src/gpu or the engine the way first GPU runs
# break, and a test under the emulation must catch it (fail, with the emulation's message where
# it has one). The file is put back after each (and on exit); the build is rebuilt at the end.
#   tools/cuda_emu/mutations.sh      (BUILD_DIR: default build, a build with ZOE_CUDA_EMU)
# About 5 minutes on 2 cores (a rebuild of the mutated target per mutation).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export ZOE_TEST_DEVICE=cuda ZOE_TEST_BINARY=$build/zoe_emu CUDA_EMU_DELAY=30
backup=$(mktemp)
current=""
restore() { [[ -n $current ]] && cp "$backup" "$root/$current"; current=""; }
trap restore EXIT

# mutate FILE OLD NEW: OLD (one line, exactly once in FILE) becomes NEW.
mutate() {
  current=$1
  cp "$root/$1" "$backup"
  python3 - "$root/$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:]
s = open(path).read()
if s.count(old) != 1:
    sys.exit(f"mutations.sh: {old!r} is not in {path} exactly once")
open(path, "w").write(s.replace(old, new))
PY
}

failed=0
# check NAME TARGET EXPECT COMMAND...: builds TARGET, runs COMMAND; it must fail and print EXPECT
# (an extended regular expression).
check() {
  local name=$1 target=$2 expect=$3; shift 3
  cmake --build "$build" --target "$target" >/dev/null
  local out rc=0
  out=$(cd "$build" && "$@" 2>&1) || rc=$?
  if [[ $rc -ne 0 ]] && grep -Eq -- "$expect" <<<"$out"; then
    echo "caught    $name: $(grep -Em1 -- "$expect" <<<"$out" | cut -c1-200)"
  else
    echo "MISSED    $name (exit $rc; expected: $expect)"
    failed=1
  fi
  restore
}

mutate src/gpu/cuda_device.cc "  ZOE_RETURN_IF_ERROR(wait_on(copy_stream, record(Stream::kCompute)));" ""
check "no event wait between the compute and copy streams (CudaDevice::upload/download)" cuda_device_gpu_test_emu \
  "cuda_emu: race on" tests/cuda_device_gpu_test_emu --gtest_filter='*UploadAndDownloadWait*'

mutate src/sched/chunk_load.cc "    ZOE_RETURN_IF_ERROR(dev_.wait_on(Stream::kH2D, dev_.record(Stream::kCompute)));
    h2d_ordered_ = true;
  }
  for (const MemoryPiece" "    h2d_ordered_ = true;
  }
  for (const MemoryPiece"
check "a gather buffer reused by the next unit's load before its last reader ran (ChunkLoad)" zero_test_emu \
  "cuda_emu: race on" tests/zero_test_emu --gtest_filter='*AQuarterOfTheFootprint*'

mutate src/gpu/cuda_device.cc "  ZOE_RETURN_IF_ERROR(make_current());
  return gpu::accumulate_cuda(" "  ZOE_RETURN_IF_ERROR(make_current());
  if (n > 0) *static_cast<volatile char*>(dst) = 0;  // mutation: host code writes device memory
  return gpu::accumulate_cuda("
check "host code reading or writing a device buffer (CudaDevice::accumulate)" cuda_device_gpu_test_emu \
  "cuda_emu: host code touched device memory" tests/cuda_device_gpu_test_emu --gtest_filter='*AccumulateIsBitwise*'

check "two ranks issue their NCCL calls in another order" nccl_order_emu \
  "NCCL call order differs between ranks" mpirun --oversubscribe -np 2 tests/nccl_order_emu --swapped

mutate src/gpu/cuda_device.cc "  ZOE_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s)," \
  "  ZOE_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s),"
check "cudaMemcpyHostToDevice for a device-to-host copy (CudaDevice::download)" cuda_device_gpu_test_emu \
  "cudaMemcpyHostToDevice copies from device memory to host memory" tests/cuda_device_gpu_test_emu \
  --gtest_filter='*UploadAndDownloadWait*'

# The fiber schedule (random, as in CI): warps drift apart to the next barrier, so one that reads
# the per-warp partials before the others wrote them gets stale values.
mutate src/gpu/cuda_kernel_util.cuh "  if (lane == 0) red[warp] = v;
  __syncthreads();" "  if (lane == 0) red[warp] = v;"
check "a block reduction without the barrier between its writes and reads (block_reduce)" cuda_model_ops_gpu_test_emu \
  "Failure" tests/cuda_model_ops_gpu_test_emu

echo "mutations.sh: rebuilding the unmutated targets"
cmake --build "$build" >/dev/null
exit $failed

#!/usr/bin/env bash
# Runs tests/cuda_model_ops_gpu_test.cc (its small cases), adam_cuda_gpu_test.cc and
# cuda_device_gpu_test.cc (but its stream-ordering cases) on the CPU: src/gpu's .cu files are
# compiled as C++ against the emulation in this folder (cuda_emu.h: fiber-scheduled blocks, a
# synchronous runtime, a naive cuBLASLt), and CudaDevice, its allocator and its kernels run on it
# against the CPU reference (Adam and the engine's kernels bitwise), as on a GPU. No substitute for
# the gpu-labelled tests on a real GPU (cuda_emu.h says what it cannot check).
#   tools/cuda_emu/run.sh [gtest args...]
# CUDA_EMU_COVERAGE=1 prints the line coverage of src/gpu after the runs (gcov). Objects go to
# $CUDA_EMU_BUILD (default /tmp/zoe-cuda-emu, or -cov). The tests run once per thread schedule of
# the emulation (CUDA_EMU_SCHEDULE: ascending, alternating, random; all three unless it is set),
# since each schedule exposes different missing barriers.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# Objects with and without coverage live apart (an object is rebuilt for its sources, not its flags).
suffix=""
[[ ${CUDA_EMU_COVERAGE:-0} == 1 ]] && suffix=-cov
out=${CUDA_EMU_BUILD:-/tmp/zoe-cuda-emu$suffix}
mkdir -p "$out"
CXX=${CXX:-g++}
cuda=${CUDA_HOME:-/usr/local/cuda}
flags=(-std=c++20 -O2 -g -Wall -Wextra -Wno-unused-parameter -I"$root/include" -I"$root/src" -I"$root/tests"
       -I"$root/tools/cuda_emu" -I"$cuda/include" $(pkg-config --cflags openblas)
       -DZOE_HAVE_CUDA=1 -DZOE_CUDA_EMU=1 -DZOE_BINARY=\"zoe\" -Wno-clobbered -Wno-psabi)

link=()
if [[ ${CUDA_EMU_COVERAGE:-0} == 1 ]]; then  # line coverage of src/gpu, printed after the runs
  flags+=(--coverage)
  link+=(--coverage)
  find "$out" -name '*.gcda' -delete
fi

objs=()
jobs_max=$(nproc)
rm -f "$out/.failed"
compile() {  # compile <source> [extra flags...]: rebuilds the object when the source or a header changed
  local src=$1; shift
  local obj="$out/$(echo "${src#$root/}" | tr / _).o"
  if [[ ! -f $obj || -n $(find "$root/src" "$root/tests" "$root/tools/cuda_emu" -newer "$obj" \
        \( -name '*.h' -o -name '*.cuh' -o -name '*.cc' -o -name '*.cu' \) -print -quit) ]]; then
    echo "compile ${src#$root/}"
    while (( $(jobs -rp | wc -l) >= jobs_max )); do wait -n || true; done
    ( "$CXX" "${flags[@]}" "$@" -c "$src" -o "$obj" || touch "$out/.failed" ) &
  fi
  objs+=("$obj")
}
compiled() {  # waits for the compiles in flight; stops when one failed
  wait
  if [[ -f $out/.failed ]]; then
    echo "tools/cuda_emu/run.sh: a compile failed (see above)" >&2
    exit 1
  fi
}

# .cu files: CUDA's vector loads (float4 over float arrays) alias as on the GPU.
cu=(-x c++ -include cuda_emu.h -fno-strict-aliasing)
adam_cpu=("$root/src/kernels/adam_scalar.cc" "$root/src/kernels/isa.cc" "$root/src/kernels/parallel_chunks.cc")
compile "$root/tools/cuda_emu/cuda_emu_runtime.cc"
compile "$root/src/gpu/gpu_info.cu" "${cu[@]}"
compile "$root/tests/test_util.cc"
common=("${objs[@]}")

# 1. The model ops against the CPU reference (whose GEMMs are kernels/gemm.h without oneDNN).
objs=()
compile "$root/src/gpu/cuda_model_ops.cu" "${cu[@]}"
compile "$root/tests/cuda_model_ops_gpu_test.cc"
for f in "$root"/src/model/host_model_ops.cc "$root"/src/model/gpt2_ops_*.cc "$root"/src/model/gpt2_block.cc \
         "$root"/src/kernels/gemm.cc "$root"/src/kernels/gemm_onednn_absent.cc; do
  compile "$f"
done
compiled
"$CXX" "${common[@]}" "${objs[@]}" -o "$out/cuda_model_ops_emu_test" "${link[@]}" -lgtest_main -lgtest -ltbb -lopenblas -lfmt \
  -lpthread

# 2. The fused Adam kernel bitwise against the CPU's scalar Adam.
objs=()
compile "$root/src/gpu/adam_cuda.cu" "${cu[@]}"
compile "$root/tests/adam_cuda_gpu_test.cc"
for f in "${adam_cpu[@]}"; do compile "$f"; done
compile "$root/src/kernels/adam_avx2.cc" -mavx2 -mfma -mf16c
compile "$root/src/kernels/adam_avx512.cc" -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c
compiled
adam_objs=("${objs[0]}" "${objs[@]:2}")  # the CUDA and CPU Adams (every ISA), not the test
"$CXX" "${common[@]}" "${objs[@]}" -o "$out/adam_cuda_emu_test" "${link[@]}" -lgtest_main -lgtest -ltbb -lfmt -lpthread

# 3. CudaDevice (copies, events, the engine's kernels, Adam over ranges, budgets) against the CPU's
# results, on a synchronous runtime: each call has finished when it returns.
objs=()
compile "$root/tests/cuda_device_gpu_test.cc"
for f in "$root"/src/gpu/cuda_device.cc "$root"/src/gpu/caching_allocator.cc "$root"/src/common/ledger.cc \
         "$root"/src/comm/sum_chunks.cc; do
  compile "$f"
done
compile "$root/src/gpu/device_kernels.cu" "${cu[@]}"
compile "$root/src/gpu/cuda_model_ops.cu" "${cu[@]}"
compiled
"$CXX" "${common[@]}" "${objs[@]}" "${adam_objs[@]}" -o "$out/cuda_device_emu_test" "${link[@]}" -lgtest_main -lgtest -ltbb \
  -lopenblas -lfmt -lpthread

for schedule in ${CUDA_EMU_SCHEDULE:-ascending alternating random}; do
  echo "== schedule $schedule"
  CUDA_EMU_SCHEDULE=$schedule "$out/cuda_model_ops_emu_test" "$@"
  CUDA_EMU_SCHEDULE=$schedule "$out/adam_cuda_emu_test" "$@"
  # Ordering tests prove nothing where each call has finished when it returns (and their long
  # kernels take a minute here): left to a GPU until the emulated streams are asynchronous.
  CUDA_EMU_SCHEDULE=$schedule "$out/cuda_device_emu_test" \
    --gtest_filter=-CudaDeviceTest.WaitOnOrdersStreams:CudaDeviceTest.UploadAndDownloadWaitForTheComputeStream "$@"
done

if [[ ${CUDA_EMU_COVERAGE:-0} == 1 ]]; then
  echo "== line coverage of src/gpu under the emulation (gcov; a header counts once, at its best object)"
  (cd "$out" && for o in src_gpu_*.o; do gcov -n -o "$o" "$root/src/gpu/$(basename "${o#src_gpu_}" .o)"; done) |
    python3 -c '
import re, sys
best = {}
for name, pct, n in re.findall(r"File .(.*?).\nLines executed:([0-9.]+)% of (\d+)", sys.stdin.read()):
    if "/src/gpu/" in name:
        f = name.split("/src/gpu/")[1]
        hit = round(float(pct) * int(n) / 100)
        if f not in best or hit > best[f][0]:
            best[f] = (hit, int(n))
for f, (hit, n) in sorted(best.items()):
    print(f"{f:28s} {hit:5d} of {n:5d} lines  {100 * hit / max(n, 1):5.1f} %")
hit = sum(h for h, _ in best.values()); n = sum(n for _, n in best.values())
print("%-28s %5d of %5d lines  %5.1f %%  (not built here: nccl_comm.cc)" % ("total", hit, n, 100 * hit / max(n, 1)))
'
fi

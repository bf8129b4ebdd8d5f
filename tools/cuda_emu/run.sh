#!/usr/bin/env bash
# src/gpu on the CPU emulation of CUDA (tools/cuda_emu): the emu-labelled tests of a build made
# with ZOE_CUDA_EMU (tools/build.sh makes one wherever nvcc is found) under every thread schedule
# of the emulation (CUDA_EMU_SCHEDULE: ascending, alternating, random, chaos; the test suite runs
# random for every test and the others for the kernels' tests), then src/gpu's line coverage.
#   tools/cuda_emu/run.sh [ctest args...]      (BUILD_DIR: default build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
find "$build/CMakeFiles/zoe_gpu_emu.dir" -name '*.gcda' -delete
for schedule in ${CUDA_EMU_SCHEDULE:-ascending alternating random chaos}; do
  echo "== schedule $schedule"
  (cd "$build" && CUDA_EMU_SCHEDULE=$schedule ctest -L emu -j "$(nproc)" --output-on-failure "$@")
done
"$root/tools/cuda_emu/coverage.sh" "$build"

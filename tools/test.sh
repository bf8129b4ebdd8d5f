#!/usr/bin/env bash
# README command 2 (and CI): install, build, run the whole test suite (unit, mpi, python, slow; gpu
# tests skip with a message where no GPU is present), the CUDA model kernels under the CPU
# emulation (tools/cuda_emu, skipped when ctest arguments pick tests), then the sanitizer passes
# (tools/test-sanitize.sh: unit, mpi and fuzz tests under AddressSanitizer + UBSan; then
# tools/test-tsan.sh: the engine's threads under ThreadSanitizer; ZOE_SKIP_SANITIZE=1 skips both).
# Arguments go to both ctest runs (e.g. -R config).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
# The .deb files the GPU check carries (a cached, ~20 MiB download; the gpudeps_probe test builds
# against them and skips without them, so a registry hiccup here is no failure).
tools/gpu-check.sh --prepare || echo "note: tools/gpu-check.sh --prepare failed; the gpudeps_probe test will skip"
start=$SECONDS
tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
(cd build && ctest --output-on-failure -j 2 --timeout 900 "$@")
echo "test.sh: Release build + tests took $((SECONDS - start)) s"
# The CUDA model kernels (src/gpu/cuda_model_ops.cu, fp32 and bf16) and Adam kernel on the CPU through
# tools/cuda_emu: no GPU is needed, only CUDA's headers. One thread schedule (random) keeps it near
# a minute; `tools/cuda_emu/run.sh` alone runs all three. It ends with src/gpu's line coverage.
if [ $# -eq 0 ]; then
  if [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime.h" ]; then
    emu_start=$SECONDS
    CUDA_EMU_SCHEDULE=random CUDA_EMU_COVERAGE=1 tools/cuda_emu/run.sh
    echo "test.sh: the CUDA kernels under tools/cuda_emu took $((SECONDS - emu_start)) s"
  else
    echo "test.sh: SKIP tools/cuda_emu (no CUDA headers at ${CUDA_HOME:-/usr/local/cuda})"
  fi
fi
if [ "${ZOE_SKIP_SANITIZE:-0}" != 1 ]; then
  tools/test-sanitize.sh "$@"
  tools/test-tsan.sh
fi
echo "test.sh: all passes took $((SECONDS - start)) s"

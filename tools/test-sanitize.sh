#!/usr/bin/env bash
# The sanitizer pass of tools/test.sh: builds build-san/ with clang, AddressSanitizer + UBSan and
# the libFuzzer targets (CPU, and src/gpu on tools/cuda_emu where CUDA's headers are), then runs
# the unit, mpi and fuzz tests there, and the emulated kernels' and device's tests (not slow: the
# Release pass runs those; not gpu: this build has no CUDA; mpi at 2 and 3 ranks, the Release
# pass adds 4; 15 s per fuzz target, ZOE_FUZZ_SECONDS=N for more). A memory error, UB, leak or fuzzer
# crash fails it. CMake gives every test the sanitizer options (ZOE_TEST_ENV, tools/lsan.supp).
# Arguments go to ctest; a first argument --build-only or --tests-only runs one half (tools/test.sh
# builds before the emulation's mutation checks change src/, and tests beside them).
set -euo pipefail
cd "$(dirname "$0")/.."
phase=all
case "${1:-}" in --build-only | --tests-only) phase=${1#--}; shift ;; esac
start=$SECONDS
# Where CUDA's headers are (as in CI), src/gpu is built on the emulation too (ZOE_CUDA=EMU: no
# nvcc) and its kernels' and device's tests run here: out-of-bounds shared memory, UB in a kernel.
cuda=OFF
[ -x /usr/local/cuda/bin/nvcc ] && cuda=EMU
if [ "$phase" != tests-only ]; then
  CC=clang CXX=clang++ cmake $(tools/generator.sh build-san) -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_CUDA="$cuda" \
    -DZOE_SANITIZE=address,undefined -DZOE_FUZZ=ON -DZOE_FUZZ_SECONDS="${ZOE_FUZZ_SECONDS:-15}" \
    -DZOE_UNITY_BUILD=ON >/dev/null
  cmake --build build-san -j "$(nproc)"
fi
built=$SECONDS
[ "$phase" = build-only ] && { echo "test-sanitize.sh: build $((built - start)) s"; exit 0; }
tools/seed-ctest-costs.sh build-san tests/ctest_costs/sanitize.txt  # long tests first (tools/test.sh)
# Left out here too: two tests whose point is not memory (the default job's 50-step loss curve,
# 50 s under ASan; the PyTorch row of `zoe bench step`, whose zoe side the WithoutTorch test runs).
(cd build-san && ctest --output-on-failure -j 2 --timeout 900 -L 'unit|mpi|fuzz' \
  -E '_np4$|^Cli.TheDefaultJobsFirstFiftyStepsDoNotSpike$|^StepBench.PyTorchBaselineIsMeasuredInTheSameRun$' "$@")
if [ "$cuda" = EMU ]; then
  (cd build-san && ctest --output-on-failure -j 2 --timeout 900 -L emu -E full_emu "$@")
fi
echo "test-sanitize.sh: build $((built - start)) s, tests $((SECONDS - built)) s"

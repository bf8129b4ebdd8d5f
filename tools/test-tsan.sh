#!/usr/bin/env bash
# ThreadSanitizer on the engine's threads (the optimizer's pass beside the next forward, the NVMe
# I/O thread, the CPU device's copy workers, the communication thread): builds build-tsan/ with clang (CPU only) and runs the
# single-process engine tests there. The last pass of tools/test.sh (about 3 minutes on 2 cores:
# the engine's libraries as unity builds). Arguments go to ctest; a first argument --build-only or
# --tests-only runs one half (as tools/test-sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
phase=all
case "${1:-}" in --build-only | --tests-only) phase=${1#--}; shift ;; esac
start=$SECONDS
if [ "$phase" != tests-only ]; then
  CC=clang CXX=clang++ cmake $(tools/generator.sh build-tsan) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_CUDA=OFF \
    -DZOE_SANITIZE=thread -DZOE_UNITY_BUILD=ON >/dev/null
  cmake --build build-tsan -j "$(nproc)" --target zero_test nvme_store_test prefetch_policy_test profiler_test window_sums_test nvme_state_test optimizer_windows_test
fi
built=$SECONDS
[ "$phase" = build-only ] && { echo "test-tsan.sh: build $((built - start)) s"; exit 0; }
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
(cd build-tsan && ctest --output-on-failure -j 2 -R '(ZeroOneRank|CommWorker|ShardLayout|NvmeStoreTest|NvmeRoundTrip|NvmeFaultTest|UnitTrace|PrefetchPolicy|Profiler|WindowSumsTest|WindowSumsEngine|StateArrayOnNvme|ChunkLoadTest|OptimizerWindowsTest)\.' "$@")
echo "test-tsan.sh: build $((built - start)) s, tests $((SECONDS - built)) s"

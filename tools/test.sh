#!/usr/bin/env bash
# README command 2 (and CI): install, build, run the whole test suite (unit, mpi, python, slow,
# emu: src/gpu and the engine on the CPU emulation of CUDA; gpu tests skip with a message where no
# GPU is present), the emulated kernels' tests under the other schedules and src/gpu's coverage under
# emu (at least 95 %), then the sanitizer passes (tools/test-sanitize.sh: unit, mpi and fuzz tests under
# AddressSanitizer + UBSan; tools/test-tsan.sh: the engine's threads under ThreadSanitizer;
# ZOE_SKIP_SANITIZE=1 skips both) beside the emulation's mutation checks (skipped, with the
# schedules and coverage, when ctest arguments pick tests). Arguments go to both ctest runs (e.g. -R config).
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenBLAS (pthreads) starts a worker per core when it loads, which spins ~0.1 s of CPU before it
# sleeps: in each of the suite's thousands of short processes. One at load: zoe's threaded
# products set their count before each call (src/kernels/gemm.cc) and OpenBLAS grows its pool
# then; the test MLP's products keep one (the trainer only lowers the count).
export OPENBLAS_NUM_THREADS=1
tools/install-deps.sh
# The .deb files the GPU check carries (a cached, ~20 MiB download; the gpudeps_probe test builds
# against them and skips without them, so a registry hiccup here is no failure).
tools/gpu-check.sh --prepare || echo "note: tools/gpu-check.sh --prepare failed; the gpudeps_probe test will skip"
start=$SECONDS
tools/build.sh
# A fresh build has no ctest cost data and would run the tests in definition order, the longest
# (the emulated full-size ops, 100 s) among the last: seeded from tests/ctest_costs/, ctest -j
# starts the long tests first (~50 s less on 2 cores); ctest keeps its own data after a run.
tools/seed-ctest-costs.sh build tests/ctest_costs/release.txt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The tests' temporary files go to a directory of this run's, one folder a pass, removed at the
# end: what a killed or mutated test leaves never outlives the run, and what a pass's tests left
# behind fails the suite, named (a test removes what it makes: tests/test_util.h's make_temp_dir).
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/zoe-suite.XXXXXX")
trap 'rm -rf "$run_tmp"' EXIT
leftovers_rc=0
# pass_tmp NAME: a fresh $TMPDIR for one pass's tests.
pass_tmp() { export TMPDIR=$run_tmp/$1 && mkdir -p "$TMPDIR"; }
# check_left NAME: what the pass's tests left in its $TMPDIR (OpenMPI's session folder aside).
check_left() {
  local left
  left=$(find "$run_tmp/$1" -mindepth 1 -maxdepth 1 ! -name 'ompi.*' -printf '%f\n' | sort)
  [[ -z $left ]] && return 0
  echo "test.sh: the $1 pass's tests left $(wc -l <<<"$left") entries in \$TMPDIR (each test removes what it makes):"
  head -20 <<<"$left"
  leftovers_rc=1
}
pass_tmp release
# Old coverage counts go: the report below is this run's.
find build/CMakeFiles/zoe_gpu_emu.dir -name '*.gcda' -delete 2>/dev/null || true
(cd build && ctest --output-on-failure -j 2 --timeout 900 "$@")
echo "test.sh: Release build + tests took $((SECONDS - start)) s"
check_left release
# src/gpu's line coverage under the emu-labelled tests that ctest just ran (src/gpu on the CPU
# emulation of CUDA, tools/cuda_emu; built wherever nvcc is, as here and in CI).
mutations=0 coverage_rc=0
if [ $# -eq 0 ] && [ -d build/CMakeFiles/zoe_gpu_emu.dir ]; then
  # The kernels' tests under the other schedules of the emulation (threads and interleaved blocks),
  # with another seed (the suite above ran the random one, seed 12345; the engine's tests do not
  # depend on the schedule).
  pass_tmp schedules
  for schedule in ascending alternating chaos; do
    echo "test.sh: the emulated kernels' tests under CUDA_EMU_SCHEDULE=$schedule CUDA_EMU_SEED=2"
    (cd build && CUDA_EMU_SCHEDULE=$schedule CUDA_EMU_SEED=2 ctest -j 2 --timeout 900 --output-on-failure \
      -R '^emu\.(CudaModelOpsTest|AdamCuda|CudaDevice|GpuFaults\.AFailed)')
  done
  check_left schedules
  # (held to 95 %, issue 43's floor: a shortfall fails the suite after the passes below)
  echo "test.sh: line coverage of src/gpu under tools/cuda_emu:"
  tools/cuda_emu/coverage.sh build --min 95 || coverage_rc=$?
  mutations=1
fi
sanitize=1
[ "${ZOE_SKIP_SANITIZE:-0}" = 1 ] && sanitize=0
# The sanitizer builds read src/, which the mutation checks change: they are built first, and
# their tests run beside the mutations (a compile and one test at a time: about one core of the
# two for ~6 minutes, which ran alone before).
if [ $sanitize = 1 ]; then
  tools/test-sanitize.sh --build-only
  tools/test-tsan.sh --build-only
fi
if [ $mutations = 1 ]; then
  # Each mutation must be caught by a test under the emulation (exit 1 if one is missed).
  mutation_log=$run_tmp/mutations.log
  mkdir -p "$run_tmp/mutations"  # a mutated test may leave its files: not checked
  TMPDIR=$run_tmp/mutations tools/cuda_emu/mutations.sh >"$mutation_log" 2>&1 &
  mutation_pid=$!
fi
rc=0
if [ $sanitize = 1 ]; then
  pass_tmp sanitizers
  { tools/test-sanitize.sh --tests-only "$@" && tools/test-tsan.sh --tests-only; } || rc=$?
  [ $rc -ne 0 ] || check_left sanitizers
fi
if [ $mutations = 1 ]; then
  mutation_rc=0
  wait $mutation_pid || mutation_rc=$?
  echo "test.sh: the emulation's mutation checks (run beside the sanitizer passes):"
  cat "$mutation_log"
  rm -f "$mutation_log"
  [ $mutation_rc -eq 0 ] || rc=$mutation_rc
fi
[ $coverage_rc -eq 0 ] || rc=$coverage_rc
[ $leftovers_rc -eq 0 ] || rc=$leftovers_rc
echo "test.sh: all passes took $((SECONDS - start)) s"
exit $rc

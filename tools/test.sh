#!/usr/bin/env bash
# README command 2 (and CI): install, build, run the whole test suite (unit, mpi, slow; gpu tests
# skip with a message where no GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build && ctest --output-on-failure -j 2 --timeout 900 "$@"

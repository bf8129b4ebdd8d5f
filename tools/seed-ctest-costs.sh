#!/usr/bin/env bash
# tools/seed-ctest-costs.sh BUILD_DIR SEED: gives a build without ctest cost data the seed's
# (name, runs, mean seconds per test; regenerate one from a warm build's
# Testing/Temporary/CTestCostData.txt), so that `ctest -j` starts the long tests first. A build
# that has its own data keeps it: ctest updates that file after every run.
set -euo pipefail
dir=$1/Testing/Temporary
[ -s "$dir/CTestCostData.txt" ] && exit 0
mkdir -p "$dir"
cp "$2" "$dir/CTestCostData.txt"

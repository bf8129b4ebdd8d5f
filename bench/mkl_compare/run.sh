#!/usr/bin/env bash
# oneMKL's bf16 GEMM against oneDNN on the GPT-2 step's products (issue 51): installs PyPI's
# `mkl` wheel into a venv under OUT (default out/mkl_compare), builds mkl_compare.cc against this
# build's kernels library, and runs it at 1 and 2 threads. MKL runs on GNU OpenMP (libgomp), as
# oneDNN does here. Needs tools/build.sh first.
#   bench/mkl_compare/run.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/out/mkl_compare}
build=${BUILD_DIR:-$root/build}
mkdir -p "$out"
if [[ ! -x $out/venv/bin/python ]]; then python3 -m venv "$out/venv"; fi
"$out/venv/bin/pip" install -q mkl==2025.3.0
lib=$(dirname "$(find "$out/venv" -name 'libmkl_rt.so.2' | head -1)")
g++ -std=c++20 -O2 -I "$root/src" -I "$root/include" "$root/bench/mkl_compare/mkl_compare.cc" -o "$out/mkl_compare" \
  "$build/libzoe_kernels.a" "$build/libzoe_common.a" -ltbb -lopenblas -ldnnl -lgomp -lfmt -lpthread -ldl
lscpu | grep -m1 'Model name'
for t in 1 2; do LD_LIBRARY_PATH=$lib MKL_THREADING_LAYER=GNU "$out/mkl_compare" "$t"; done

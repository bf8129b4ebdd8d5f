#!/usr/bin/env bash
# Configures and builds zoe into build/ (CUDA code too when nvcc is present: ZOE_CUDA=AUTO), the
# libraries as unity builds (ZOE_UNITY_BUILD=OFF for faster incremental rebuilds).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake $(tools/generator.sh build) -S . -B build -DCMAKE_BUILD_TYPE=Release -DZOE_CUDA="${ZOE_CUDA:-AUTO}" \
  -DZOE_UNITY_BUILD="${ZOE_UNITY_BUILD:-ON}" >/dev/null
cmake --build build -j "$(nproc)"

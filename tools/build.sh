#!/usr/bin/env bash
# Configures and builds zoe into build/ (CUDA code too when nvcc is present: ZOE_CUDA=AUTO).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DZOE_CUDA="${ZOE_CUDA:-AUTO}" >/dev/null
cmake --build build -j "$(nproc)"

#!/usr/bin/env bash
# README command 1: install what is needed, build, and run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
mkdir -p out
mpirun --oversubscribe -np 2 build/zoe train --report out/report.jsonl "$@"
echo "report: out/report.jsonl"

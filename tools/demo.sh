#!/usr/bin/env bash
# README command 1: install what is needed, build, and run the main job on the embedded default:
# a small GPT-2 on data/corpus.txt, 2 MPI ranks, ZeRO stage 3, bf16, the optimizer state on NVMe
# under out/nvme (about two minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
mkdir -p out
rm -rf out/checkpoints  # a fresh run each time (zoe train resumes from a checkpoint it finds)
mpirun --oversubscribe -np 2 build/zoe train --report out/report.jsonl "$@"
build/zoe export --checkpoint out/checkpoints --out out/model.safetensors
echo "report: out/report.jsonl   checkpoints: out/checkpoints   weights (HF GPT-2 names): out/model.safetensors"

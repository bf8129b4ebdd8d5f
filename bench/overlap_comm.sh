#!/usr/bin/env bash
# zoe train at 2 ranks with zero_optimization.overlap_comm true and false, alternating, ROUNDS
# rounds: per run the median step_s of steps 2-6 and the last step's wait_comm (the caller's
# thread waiting for collectives). Results: bench/RESULTS.md "Collectives on the communication thread".
# usage: bench/overlap_comm.sh STAGE ROUNDS [more --set options]
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?stage}; rounds=${2:?rounds}; shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
for round in $(seq 1 "$rounds"); do
  for ov in true false; do
    rm -rf "$out/ck"
    mpirun --oversubscribe -np 2 ./build/zoe train --quiet --set zoe.steps=6 --set zero_optimization.stage="$stage" \
      --set zero_optimization.offload_optimizer.device='"none"' --set zoe.model.n_layer=12 \
      --set zoe.model.n_embd=512 --set zoe.model.n_head=8 --set train_micro_batch_size_per_gpu=4 \
      --set zoe.device_memory_budget='"4GiB"' --set zero_optimization.overlap_comm=$ov \
      --set zoe.checkpoint.dir="\"$out/ck\"" --set zoe.checkpoint.every=1000 "$@" --report "$out/r.jsonl" \
      > "$out/log" 2>&1 || { echo "zoe train failed:"; tail -5 "$out/log"; exit 1; }
    python3 - "$out/r.jsonl" "$stage" "$ov" <<'PY'
import json, statistics, sys
rs = [r for r in (json.loads(l) for l in open(sys.argv[1])) if "step_s" in r]
st = [r["step_s"] for r in rs][1:]
print(f"stage {sys.argv[2]} overlap_comm {sys.argv[3]:5}  median step_s {statistics.median(st):.3f}  "
      f"wait_comm_s {rs[-1]['time_s']['wait_comm']:.3f}")
PY
  done
done
rm -rf "$out"

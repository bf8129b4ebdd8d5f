#!/usr/bin/env bash
# bf16 compute on the GPU against the CPU device: the same GPT-2 job (bf16 weights, zoe.compute_dtype
# bf16, the embedded corpus, no offload), STEPS steps on each at stage 0 and at stage 3. Prints both
# losses per step, the largest relative difference, and each run's median tokens/s.
#   bench/gpu_bf16_parity.sh [ZOE] [STEPS]     (default: build-gpu/zoe, or build/zoe; 20 steps)
# The two devices' bf16 products add in different orders, so the losses agree to bf16's precision
# (the CPU tests hold zoe's bf16 mode to 2e-2 of transformers' autocast), not bitwise.
set -euo pipefail
ZOE=${1:-}
if [[ -z $ZOE ]]; then for z in build-gpu/zoe build/zoe; do [[ -x $z ]] && { ZOE=$z; break; }; done; fi
[[ -x ${ZOE:-} ]] || { echo "no zoe binary (give its path)" >&2; exit 2; }
STEPS=${2:-20}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

run() {  # device stage -> $DIR/device_stage.jsonl
  "$ZOE" train --quiet --set zoe.device="\"$1\"" --set zero_optimization.stage="$2" \
    --set zoe.model.type='"gpt2"' --set zoe.model.n_layer=4 --set zoe.model.n_embd=256 --set zoe.model.n_head=4 \
    --set zoe.data.seq_len=128 --set train_micro_batch_size_per_gpu=8 --set bf16.enabled=true \
    --set zoe.compute_dtype='"bf16"' --set zero_optimization.offload_param.device='"none"' \
    --set zero_optimization.offload_optimizer.device='"none"' --set zoe.steps="$STEPS" \
    --set zoe.checkpoint.dir='""' --report "$DIR/$1_$2.jsonl"
}

for stage in 0 3; do
  run cuda $stage
  run cpu $stage
  python3 - "$DIR/cuda_$stage.jsonl" "$DIR/cpu_$stage.jsonl" "$stage" <<'PY'
import json, statistics, sys
def read(p):
    rows = [json.loads(l) for l in open(p)]
    return [r for r in rows if "step" in r]
g, c, stage = read(sys.argv[1]), read(sys.argv[2]), sys.argv[3]
assert len(g) == len(c) and g, "the runs made different numbers of steps"
worst = 0.0
print(f"stage {stage}: step  loss gpu      loss cpu      rel diff")
for a, b in zip(g, c):
    d = abs(a["loss"] - b["loss"]) / abs(b["loss"])
    worst = max(worst, d)
    print(f"        {a['step']:4d}  {a['loss']:.6f}  {b['loss']:.6f}  {d:.2e}")
tps = lambda rows: statistics.median(r["tokens_per_s"] for r in rows[1:] or rows)
print(f"stage {stage}: largest rel diff {worst:.2e}; tokens/s gpu {tps(g):.0f}, cpu {tps(c):.0f}")
PY
done

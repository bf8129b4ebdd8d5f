#!/usr/bin/env bash
# zoe against DeepSpeed ZeRO-Infinity on one GPU, same model, batch, placement and GPU memory
# (issue 48). On the GPU machine, with .gpudeps/ carried (tools/deepspeed-wheelhouse.sh --prepare
# and tools/gpu-check.sh --prepare here) and zoe built there (tools/gpu-check.sh: build-gpu/zoe):
#
#   bench/deepspeed_peer.sh OUTDIR
#
# installs DeepSpeed offline into OUTDIR/ds (for the python3 that holds PyTorch), then for each
# placement (ZOE_PEER_PLACEMENTS, "nvme cpu": parameters and optimizer state both there) runs
# DeepSpeed's step (bench/deepspeed_peer.py), then zoe's (`zoe train`, cuda device) on GPT-2 124M, bf16,
# ZeRO-3, micro-batch ZOE_PEER_BATCH (8) x 1024 tokens, ZOE_PEER_STEPS (6) steps, zoe's device
# budget set to DeepSpeed's measured peak GPU memory. Writes OUTDIR/peer.json (one object per run)
# and OUTDIR/peer.md (the table: tokens/s, zoe / DeepSpeed, GPU memory, losses first -> last).
# Knobs: ZOE_BIN (build-gpu/zoe), ZOE_PEER_NVME (OUTDIR/nvme), ZOE_TORCH_PYTHON (python3),
# ZOE_PEER_TIMEOUT_S (240, each run), ZOE_PEER_DEVICE (cuda; cpu with ZOE_PEER_SMALL=1: the smoke
# test a machine without a GPU runs).
set -uo pipefail

REPO=$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")
OUT=${1:?usage: bench/deepspeed_peer.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(readlink -f "$OUT")
ZOE=${ZOE_BIN:-$REPO/build-gpu/zoe}
NVME=${ZOE_PEER_NVME:-$OUT/nvme}
BATCH=${ZOE_PEER_BATCH:-8}
STEPS=${ZOE_PEER_STEPS:-6}
LIMIT=${ZOE_PEER_TIMEOUT_S:-240}  # a run's limit, seconds: the four fit one 600 s device call with the builds
DEVICE=${ZOE_PEER_DEVICE:-cuda}
read -ra PLACEMENTS <<<"${ZOE_PEER_PLACEMENTS:-nvme cpu}"
# GPT-2 124M; ZOE_PEER_SMALL=1: 2 layers of 64, 64 tokens (a smoke test on the CPU device)
read -r LAYERS EMBD HEADS VOCAB SEQ <<<"12 768 12 50257 1024"
[[ ${ZOE_PEER_SMALL:-0} == 1 ]] && read -r LAYERS EMBD HEADS VOCAB SEQ <<<"2 64 2 256 64"
LOG=$OUT/peer.log
: >"$LOG"
: >"$OUT/peer.json"

say() { echo "[deepspeed-peer] $*" | tee -a "$LOG"; }

[[ -x $ZOE ]] || { say "no zoe binary at $ZOE (tools/gpu-check.sh builds build-gpu/zoe; or set ZOE_BIN)"; exit 1; }
if [[ ! -f $OUT/ds/ds_env.sh ]]; then
  "$REPO/tools/deepspeed-wheelhouse.sh" --install "$OUT/ds" >>"$LOG" 2>&1 ||
    { say "DeepSpeed's offline install failed (see $LOG)"; exit 1; }
fi
# shellcheck disable=SC1091
source "$OUT/ds/ds_env.sh"
PY=$ZOE_DS_PYTHON

zoe_config() {  # placement, device budget in bytes
  cat <<EOF
{
  "train_micro_batch_size_per_gpu": $BATCH,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "$1", "nvme_path": "$NVME/zoe", "pin_memory": true},
    "offload_param": {"device": "$1", "nvme_path": "$NVME/zoe", "pin_memory": true}},
  "zoe": {"device": "$DEVICE", "device_memory_budget": $2,
    "model": {"type": "gpt2", "n_layer": $LAYERS, "n_head": $HEADS, "n_embd": $EMBD, "vocab_size": $VOCAB,
              "n_positions": $SEQ},
    "data": {"train": "$REPO/data/corpus.txt", "format": "bytes", "seq_len": $SEQ},
    "steps": $STEPS, "checkpoint": {"dir": ""}}
}
EOF
}

status=0
for placement in "${PLACEMENTS[@]}"; do
  mkdir -p "$NVME/ds" "$NVME/zoe"
  say "DeepSpeed, $placement"
  if ! timeout "$LIMIT" "$PY" "$REPO/bench/deepspeed_peer.py" --offload "$placement" --nvme-path "$NVME/ds" \
      --micro-batch "$BATCH" --steps "$STEPS" --layers "$LAYERS" --embd "$EMBD" --heads "$HEADS" --vocab "$VOCAB" \
      --positions "$SEQ" --seq "$SEQ" --json "$OUT/ds_$placement.json" >>"$LOG" 2>&1; then
    say "DeepSpeed $placement failed or its loss did not fall (see $LOG)"; status=1
  fi
  budget=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_gpu_bytes"])' \
    "$OUT/ds_$placement.json" 2>/dev/null || echo 0)
  ((budget > 0)) || budget=$((8 << 30))
  zoe_config "$placement" "$budget" >"$OUT/zoe_$placement.config.json"
  say "zoe, $placement, device budget $budget bytes"
  if ! timeout "$LIMIT" "$ZOE" train --quiet --config "$OUT/zoe_$placement.config.json" \
      --report "$OUT/zoe_$placement.jsonl" >>"$LOG" 2>&1; then
    say "zoe $placement failed (see $LOG)"; status=1
  fi
  rm -rf "$NVME/ds" "$NVME/zoe"
done

"$PY" - "$OUT" "$BATCH" "$SEQ" "${PLACEMENTS[@]}" <<'EOF' | tee -a "$LOG"
import json, os, statistics, sys
out, batch, seq, places = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = ["| placement | DeepSpeed tok/s | zoe tok/s | zoe / DeepSpeed | GPU GB DS / zoe budget | losses DS | losses zoe |",
        "|---|---|---|---|---|---|---|"]
with open(os.path.join(out, "peer.json"), "w") as pj:
    for p in places:
        ds = json.load(open(os.path.join(out, f"ds_{p}.json"))) if os.path.exists(os.path.join(out, f"ds_{p}.json")) else None
        zr = os.path.join(out, f"zoe_{p}.jsonl")
        steps = [json.loads(l) for l in open(zr)] if os.path.exists(zr) else []
        steps = [s for s in steps if "step_s" in s]
        z = None
        if steps:
            med = statistics.median(s["step_s"] for s in steps[2:] or steps)
            z = {"engine": "zoe", "placement": p, "median_step_s": med, "tokens_per_s": batch * seq / med,
                 "losses": [s.get("loss") for s in steps]}
        for r in (ds, z):
            if r:
                pj.write(json.dumps(r) + "\n")
        f = lambda x: f"{x:,.0f}" if x else "-"
        ratio = f"{z['tokens_per_s'] / ds['tokens_per_s']:.2f}x" if ds and z else "-"
        loss = lambda l: f"{l[0]:.3f} -> {l[-1]:.3f}" if l and l[0] is not None else "-"
        rows.append(f"| {p} | {f(ds and ds['tokens_per_s'])} | {f(z and z['tokens_per_s'])} | {ratio} | "
                    f"{(ds['peak_gpu_bytes'] / 1e9 if ds else 0):.2f} | {loss(ds and ds['losses'])} | "
                    f"{loss(z and z['losses'])} |")
open(os.path.join(out, "peer.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
exit $status

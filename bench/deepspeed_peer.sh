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
# and OUTDIR/peer.md (the table: tokens/s, zoe / DeepSpeed, GPU memory, losses first -> last),
# rewritten after each placement, so a run cut short keeps what it measured. DeepSpeed's ops
# (CPU Adam, async I/O) are built first, on their own and timed (TORCH_EXTENSIONS_DIR under
# OUTDIR/ds). Time: the install ~15 s, the op builds 1-3 min, then each run its limit at most:
# on a GPU lease give this a device call of its own (after tools/gpu-check.sh --build-only).
# Knobs: ZOE_BIN (build-gpu/zoe), ZOE_PEER_NVME (${TMPDIR:-/tmp}/zoe-peer-nvme.PID: swap files stay
# out of OUTDIR, which a device call sends back), ZOE_TORCH_PYTHON (python3), ZOE_PEER_TIMEOUT_S
# (240, each run), ZOE_PEER_BUILD_S (420, the ops' builds), ZOE_PEER_DEVICE (cuda; cpu with ZOE_PEER_SMALL=1: the smoke test a machine
# without a GPU runs; ZOE_PEER_SMALL=2: a small model whose tensors still pass DeepSpeed's 1 MiB
# swap threshold, so its NVMe placement really swaps).
set -uo pipefail

REPO=$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")
OUT=${1:?usage: bench/deepspeed_peer.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(readlink -f "$OUT")
ZOE=${ZOE_BIN:-$REPO/build-gpu/zoe}
NVME=${ZOE_PEER_NVME:-${TMPDIR:-/tmp}/zoe-peer-nvme.$$}
BATCH=${ZOE_PEER_BATCH:-8}
STEPS=${ZOE_PEER_STEPS:-6}
LIMIT=${ZOE_PEER_TIMEOUT_S:-240}  # a run's limit, seconds
BUILD_LIMIT=${ZOE_PEER_BUILD_S:-420}  # the ops' builds (on 16 cores ~1 min; on 2, 3-5 min)
DEVICE=${ZOE_PEER_DEVICE:-cuda}
read -ra PLACEMENTS <<<"${ZOE_PEER_PLACEMENTS:-nvme cpu}"
# GPT-2 124M; ZOE_PEER_SMALL=1: 2 layers of 64, 64 tokens (a smoke test on the CPU device)
read -r LAYERS EMBD HEADS VOCAB SEQ <<<"12 768 12 50257 1024"
[[ ${ZOE_PEER_SMALL:-0} == 1 ]] && read -r LAYERS EMBD HEADS VOCAB SEQ <<<"2 64 2 256 64"
[[ ${ZOE_PEER_SMALL:-0} == 2 ]] && read -r LAYERS EMBD HEADS VOCAB SEQ <<<"2 512 8 4096 64"
LOG=$OUT/peer.log
: >"$LOG"
: >"$OUT/peer.json"

say() { echo "[deepspeed-peer] $*" | tee -a "$LOG"; }

[[ -x $ZOE ]] || { say "no zoe binary at $ZOE (tools/gpu-check.sh builds build-gpu/zoe; or set ZOE_BIN)"; exit 1; }
installed() { [[ -f $OUT/ds/ds_env.sh ]] && (source "$OUT/ds/ds_env.sh" && "$ZOE_DS_PYTHON" -c 'import deepspeed') 2>/dev/null; }
if ! installed; then
  t0=$SECONDS
  "$REPO/tools/deepspeed-wheelhouse.sh" --install "$OUT/ds" >>"$LOG" 2>&1 ||
    { say "DeepSpeed's offline install failed (see $LOG)"; exit 1; }
  say "DeepSpeed installed offline in $((SECONDS - t0)) s"
fi
# shellcheck disable=SC1091
source "$OUT/ds/ds_env.sh"
PY=$ZOE_DS_PYTHON
"$PY" -c 'import numpy' 2>/dev/null ||
  { say "$PY has no numpy, which DeepSpeed imports (PyTorch's wheels do not bring it): no peer run"; exit 1; }
# The ops DeepSpeed builds on first use, built now, on their own: a build that fails is named and
# timed apart from the runs. A build cut short leaves a lock file its next load would wait on.
export TORCH_EXTENSIONS_DIR=$OUT/ds/torch_extensions
find "$TORCH_EXTENSIONS_DIR" -name lock -delete 2>/dev/null
t0=$SECONDS
if ! timeout --foreground -k 10 "$BUILD_LIMIT" "$PY" -c '
import setuptools  # noqa: F401  (its distutils shim first)
from deepspeed.accelerator import get_accelerator
for name in ("CPUAdamBuilder", "AsyncIOBuilder"):
    get_accelerator().create_op_builder(name).load()
    print("built", name, flush=True)' >>"$LOG" 2>&1; then
  say "DeepSpeed's ops (CPU Adam, async I/O) did not build in $BUILD_LIMIT s (see $LOG)"; exit 1
fi
say "DeepSpeed's ops built in $((SECONDS - t0)) s"

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

# peer.json and peer.md from the runs so far (a placement not run yet: its row left out).
write_table() {
"$PY" - "$OUT" "$BATCH" "$SEQ" "$@" <<'EOF'
import json, os, statistics, sys
out, batch, seq, places = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = ["| placement | DeepSpeed tok/s | zoe tok/s | zoe / DeepSpeed | GPU GB DS allocated (= zoe's budget) / reserved "
        "| losses DS | losses zoe |", "|---|---|---|---|---|---|---|"]
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
        gpu_gb = lambda d: (f"{d['peak_gpu_bytes'] / 1e9:.2f} / {d.get('peak_gpu_reserved_bytes', 0) / 1e9:.2f}" if d
                            else "- (no DeepSpeed run: zoe at 8 GiB)")
        rows.append(f"| {p} | {f(ds and ds['tokens_per_s'])} | {f(z and z['tokens_per_s'])} | {ratio} | "
                    f"{gpu_gb(ds)} | {loss(ds and ds['losses'])} | "
                    f"{loss(z and z['losses'])} |")
open(os.path.join(out, "peer.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
}

status=0
done_places=()
for placement in "${PLACEMENTS[@]}"; do
  mkdir -p "$NVME/ds" "$NVME/zoe"
  say "DeepSpeed, $placement"
  if ! timeout --foreground -k 10 "$LIMIT" "$PY" "$REPO/bench/deepspeed_peer.py" --offload "$placement" --nvme-path "$NVME/ds" \
      --micro-batch "$BATCH" --steps "$STEPS" --layers "$LAYERS" --embd "$EMBD" --heads "$HEADS" --vocab "$VOCAB" \
      --positions "$SEQ" --seq "$SEQ" --json "$OUT/ds_$placement.json" >>"$LOG" 2>&1; then
    say "DeepSpeed $placement failed or its loss did not fall (see $LOG)"; status=1
  fi
  budget=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_gpu_bytes"])' \
    "$OUT/ds_$placement.json" 2>/dev/null || echo 0)
  ((budget > 0)) || { budget=$((8 << 30)); say "no DeepSpeed peak to match: zoe's budget is 8 GiB (its row is marked)"; }
  zoe_config "$placement" "$budget" >"$OUT/zoe_$placement.config.json"
  say "zoe, $placement, device budget $budget bytes"
  if ! timeout --foreground -k 10 "$LIMIT" "$ZOE" train --quiet --config "$OUT/zoe_$placement.config.json" \
      --report "$OUT/zoe_$placement.jsonl" >>"$LOG" 2>&1; then
    say "zoe $placement failed (see $LOG)"; status=1
  fi
  say "swap files at the end: DeepSpeed $(du -sb "$NVME/ds" 2>/dev/null | cut -f1) bytes, zoe $(du -sb "$NVME/zoe" 2>/dev/null | cut -f1) bytes"
  rm -rf "$NVME/ds" "$NVME/zoe"
  done_places+=("$placement")
  write_table "${done_places[@]}" >/dev/null
done
rmdir "$NVME" 2>/dev/null
((${#done_places[@]})) && write_table "${done_places[@]}" | tee -a "$LOG"

exit $status

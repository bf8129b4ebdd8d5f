#!/usr/bin/env bash
# ZeRO-3 on CPU ranks against PyTorch FSDP2, side by side (issue 27): GPT-2 124M (L12 C768 H12,
# vocab 50257), 2 ranks x 1 thread each, micro-batch 2 x 128 tokens per rank, bf16 (zoe: bf16
# parameters and compute, fp32 master and AdamW state, all sharded, nothing offloaded; FSDP2:
# fully_shard per block and root, MixedPrecisionPolicy bf16 parameters, fp32 reduction, fp32
# sharded master and AdamW state), AdamW lr 3e-4 constant, clipping 1.0, the bytes of
# data/corpus.txt as tokens. ROUNDS rounds alternate the two; each prints the median step time of
# the steps after 2 warm-up ones, tokens/s of the global batch and the larger rank's peak RSS;
# the last lines give zoe / FSDP2 for both (medians over rounds). Target: >= 1.3x tokens/s at
# <= 0.8x memory.
#
#   bench/fsdp2_compare.sh [ROUNDS] [STEPS]     (default 2 rounds of 8 steps; build first)
#   ZOE_TORCH_PYTHON: a python whose torch has torch.distributed.fsdp.fully_shard (torch >= 2.6)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2} steps=${2:-8}
py=${ZOE_TORCH_PYTHON:-python3}
if ! "$py" -c 'from torch.distributed.fsdp import fully_shard' 2>/dev/null; then
  echo "fsdp2_compare: $py has no torch with FSDP2 (fully_shard); set ZOE_TORCH_PYTHON" >&2
  exit 2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/config.json" <<EOF
{
  "train_micro_batch_size_per_gpu": 2,
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "zero_optimization": {"stage": 3},
  "zoe": {"device": "cpu", "device_memory_budget": "8GiB",
    "model": {"type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "n_positions": 1024},
    "data": {"train": "data/corpus.txt", "format": "bytes", "seq_len": 128},
    "steps": $steps}
}
EOF
for round in $(seq 1 "$rounds"); do
  mpirun --oversubscribe -np 2 build/zoe train --quiet --config "$out/config.json" --report "$out/zoe.jsonl" \
    > "$out/zoe.log" 2>&1 || { echo "zoe train failed:"; tail -5 "$out/zoe.log"; exit 1; }
  python3 - "$out/zoe.jsonl" >> "$out/zoe.rows" <<'PY'
import json, statistics, sys
rs = [r for r in (json.loads(l) for l in open(sys.argv[1])) if "step_s" in r]
med = statistics.median(r["step_s"] for r in rs[2:])
print(json.dumps({"median_step_s": med, "tokens_per_s": rs[0]["tokens"] / med,
                  "peak_rss_bytes": [max(r["ledger"][k]["peak_rss_bytes"] for r in rs) for k in range(len(rs[0]["ledger"]))],
                  "loss": [rs[0]["loss"], rs[-1]["loss"]]}))
PY
  OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --nproc_per_node 2 bench/fsdp2_peer.py \
    --data data/corpus.txt --warmup 2 --iters $((steps - 2)) 2> "$out/torch.log" | tail -1 >> "$out/torch.rows" \
    || { echo "FSDP2 run failed:"; tail -5 "$out/torch.log"; exit 1; }
  python3 - "$round" "$out/zoe.rows" "$out/torch.rows" <<'PY'
import json, sys
z, t = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[2:4])
for name, r in (("zoe", z), ("FSDP2", t)):
    print(f"round {sys.argv[1]} {name:6s} median step {r['median_step_s']:.3f} s  {r['tokens_per_s']:7.1f} tok/s  "
          f"peak RSS {max(r['peak_rss_bytes']) / 1e9:.2f} GB  loss {r['loss'][0]:.3f} -> {r['loss'][1]:.3f}")
PY
done
python3 - "$out/zoe.rows" "$out/torch.rows" <<'PY'
import json, statistics, sys
z, t = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
rss = lambda r: max(r["peak_rss_bytes"])  # the larger rank's
speed = statistics.median(r["tokens_per_s"] for r in z) / statistics.median(r["tokens_per_s"] for r in t)
mem = statistics.median(rss(r) for r in z) / statistics.median(rss(r) for r in t)
print(f"zoe / FSDP2: tokens/s {speed:.2f}x (target >= 1.3), peak RSS {mem:.2f}x (target <= 0.8): "
      f"{'PASS' if speed >= 1.3 and mem <= 0.8 else 'FAIL'}")
PY

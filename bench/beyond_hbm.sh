#!/usr/bin/env bash
# A model larger than the GPU (issue 48's third item, a benchmark, not a test): a GPT-2-shaped
# model whose training state (16 bytes a parameter) is BHBM_TIMES (1.15) x the GPU's memory trains
# a few steps on one GPU: bf16 weights and gradients on the GPU (stage 0), the fp32 master and the
# Adam moments offloaded (BHBM_HOME: cpu, pinned host memory up to BHBM_HOST_SHARE of RAM; or
# nvme, up to 90 % of the disk's free space) and the rest of them on the GPU: zoe's
# offload_optimizer.ratio splits an array between the device and one home. The CPU's Adam pass
# runs beside the backward (zoe.update_in_backward; no clipping, so the speculation is never taken
# back), and a step holds enough tokens for the backward to hide it. Prints what fits
# before anything is allocated (`zoe estimate`, the budgets), then per step: seconds, tokens/s,
# model FLOP/s (6 N + 12 L C T a token: PaLM's, nanoGPT's estimate_mfu) against the GPU's dense
# bf16 peak, the optimizer's and the disk's seconds, the loss; then peak GPU memory, peak host RSS
# and whether the losses fell and the figure met 0.30 of the peak.
#
#   bench/beyond_hbm.sh [DIR] [--set key=value ...]     (DIR default out/beyond-hbm; on the GPU
#                                                        machine after tools/gpu-check.sh built build-gpu/)
# Environment (defaults for one H200: 139 GiB, 128 GiB of RAM, a 64 GiB disk):
#   BHBM_ZOE (build-gpu/zoe), BHBM_DEVICE (cuda), BHBM_MEMORY_BYTES (the GPU's total: nvidia-smi),
#   BHBM_TIMES (1.15), BHBM_EMBD (4096), BHBM_HEADS (32), BHBM_VOCAB (50304), BHBM_SEQ (1024),
#   BHBM_TOKENS (tokens a step, 65536), BHBM_MICRO (micro-batch, 4), BHBM_CKPT (true),
#   BHBM_STEPS (4), BHBM_HOME (cpu), BHBM_HOST_SHARE (0.70), BHBM_RATIO (the offloaded part,
#   instead of the most the home holds), BHBM_RAM_BYTES (RAM), BHBM_PRINT_ONLY (1: the shape,
#   placement, config and estimate only),
#   BHBM_PEAK_TFLOPS (dense bf16; 989.4 for H100 / H200 SXM, else required).
# A dry run of the script itself on the CPU device, scaled to this machine (2 cores, 24 GiB):
#   BHBM_ZOE=build/zoe BHBM_DEVICE=cpu BHBM_MEMORY_BYTES=$((1<<30)) BHBM_EMBD=512 BHBM_HEADS=8 \
#   BHBM_SEQ=128 BHBM_TOKENS=1024 BHBM_MICRO=4 BHBM_STEPS=3 BHBM_RATIO=0.6 BHBM_PEAK_TFLOPS=0.3 \
#   bench/beyond_hbm.sh out/bhbm-dry
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-out/beyond-hbm}
shift || true
zoe=${BHBM_ZOE:-build-gpu/zoe}
device=${BHBM_DEVICE:-cuda}
times=${BHBM_TIMES:-1.15}
C=${BHBM_EMBD:-4096} H=${BHBM_HEADS:-32} V=${BHBM_VOCAB:-50304} T=${BHBM_SEQ:-1024}
tokens=${BHBM_TOKENS:-65536} micro=${BHBM_MICRO:-4} ckpt=${BHBM_CKPT:-true} steps=${BHBM_STEPS:-4}
die() { echo "beyond_hbm: $*" >&2; exit 2; }
home=${BHBM_HOME:-cpu}
[[ $home == cpu || $home == nvme ]] || die "BHBM_HOME is cpu or nvme, not '$home'"
gb() { awk -v b="$1" 'BEGIN { printf "%.1f GB", b / 1e9 }'; }
[[ -x $zoe ]] || die "no zoe binary at $zoe (tools/gpu-check.sh --build-only OUT builds build-gpu/, or set BHBM_ZOE)"

gpu_name=cpu
if [[ $device == cuda ]]; then
  command -v nvidia-smi >/dev/null || die "no nvidia-smi: is there a GPU? (BHBM_DEVICE=cpu for a dry run)"
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  mem=${BHBM_MEMORY_BYTES:-$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) << 20 ))}
else
  mem=${BHBM_MEMORY_BYTES:?BHBM_MEMORY_BYTES: the device budget a CPU dry run holds the model against}
fi
peak=${BHBM_PEAK_TFLOPS:-}
if [[ -z $peak ]]; then
  case $gpu_name in
    *H100*SXM* | *H100\ 80GB\ HBM3* | *H200*) peak=989.4 ;;
    *) die "the dense bf16 peak of '$gpu_name' is not known here: set BHBM_PEAK_TFLOPS" ;;
  esac
fi

# The shape: the fewest layers of width C whose state reaches `times` x the GPU's memory.
per_layer=$(( 12 * C * C + 13 * C ))
fixed=$(( V * C + T * C + 2 * C ))
L=$(awk -v m="$mem" -v t="$times" -v f="$fixed" -v p="$per_layer" \
      'BEGIN { n = (m * t / 16 - f) / p; l = int(n); if (l < n) l++; if (l < 1) l = 1; print l }')
params=$(( fixed + L * per_layer ))
state=$(( 16 * params ))
ram=${BHBM_RAM_BYTES:-$(awk '/MemTotal/ {print $2 * 1024}' /proc/meminfo)}
mkdir -p "$dir"
disk_free=$(df --output=avail -B1 "$dir" | tail -1)
# Placement: weights and gradients (bf16, 4 bytes a parameter) on the device; of the optimizer's
# 12 bytes a parameter, the most the home holds offloaded (host: BHBM_HOST_SHARE of RAM; NVMe: 90 %
# of the free space), the rest on the device.
opt=$(( 12 * params ))
if [[ $home == cpu ]]; then room=$(awk -v r="$ram" -v s="${BHBM_HOST_SHARE:-0.70}" 'BEGIN { printf "%.0f", r * s }')
else room=$(( disk_free / 10 * 9 )); fi
ratio=${BHBM_RATIO:-$(awk -v o=$opt -v h="$room" 'BEGIN { r = int(h / o * 10000) / 10000; if (r > 1) r = 1; printf "%.4f", r }')}
offloaded=$(awk -v o=$opt -v r="$ratio" 'BEGIN { printf "%.0f", o * r }')
(( offloaded <= room )) || die "the offloaded $(gb "$offloaded") do not fit the home's $(gb "$room") ($home)"
device_budget=$mem                          # a CPU device's arena: all of it
[[ $device == cuda ]] && device_budget=$(( mem - (3 << 30) ))  # the CUDA context, NCCL's and cuDNN's own (the ops' workspaces are in the budget)
host_budget=$(( (2 << 30) + (4 << 30) ))   # the NVMe tier's pinned pool, staging
[[ $home == cpu ]] && host_budget=$(( offloaded + (4 << 30) ))  # the state, staging
(( tokens % (micro * T) == 0 )) || die "BHBM_TOKENS ($tokens) is not a multiple of BHBM_MICRO x BHBM_SEQ ($micro x $T)"
accum=$(( tokens / (micro * T) ))
flops_token=$(( 6 * params + 12 * L * C * T ))
cat <<EOF
device: $gpu_name, $(gb "$mem") (budget $(gb $device_budget)); RAM $(gb "$ram"); free at $dir: $(gb "$disk_free")
model: GPT-2 L$L C$C H$H V$V T$T, $params parameters; state $(gb $state) = $(awk -v s=$state -v m="$mem" 'BEGIN{printf "%.3f", s/m}') x the device's memory
placement: device bf16 weights + gradients $(gb $(( 4 * params ))) and $(gb $(( opt - offloaded ))) of the optimizer; $home $(gb "$offloaded") of it (offload_optimizer.ratio $ratio)
step: $tokens tokens = micro-batch $micro x $accum accumulations x T $T, checkpointing $ckpt; $(awk -v f=$flops_token -v t="$tokens" 'BEGIN{printf "%.2f", f*t/1e15}') PFLOP a step; peak $peak TFLOP/s
EOF
cat > "$dir/config.json" <<EOF
{
  "train_micro_batch_size_per_gpu": $micro,
  "gradient_accumulation_steps": $accum,
  "bf16": {"enabled": true},
  "gradient_clipping": 0,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 2e-6, "warmup_max_lr": 1e-4,
    "warmup_num_steps": 1000, "warmup_type": "linear"}},
  "zero_optimization": {"stage": 0, "sub_group_size": 100000000,
    "offload_optimizer": {"device": "$home", "ratio": $ratio, "nvme_path": "$dir/nvme", "pin_memory": true}},
  "aio": {"block_size": 1048576, "queue_depth": 32},
  "zoe": {"device": "$device", "device_memory_budget": $device_budget, "host_memory_budget": $host_budget,
    "compute_dtype": "bf16", "activation_checkpointing": $ckpt, "update_in_backward": true,
    "checkpoint": {"dir": ""},
    "model": {"type": "gpt2", "n_layer": $L, "n_head": $H, "n_embd": $C, "vocab_size": $V, "n_positions": $T},
    "data": {"train": "data/corpus.txt", "format": "bytes", "seq_len": $T},
    "steps": $steps}
}
EOF
echo "--- zoe estimate (the ledger per tier, ratio not applied) ---"
"$zoe" estimate --params "$params" --config "$dir/config.json"
[[ ${BHBM_PRINT_ONLY:-0} == 1 ]] && exit 0
echo "--- zoe train ($dir/config.json) ---"
start=$(date +%s)
rm -f "$dir/report.jsonl"
"$zoe" train --config "$dir/config.json" --report "$dir/report.jsonl" "$@"
echo "total wall time (start-up, init, every step): $(( $(date +%s) - start )) s"
python3 - "$dir/report.jsonl" "$flops_token" "$peak" "$state" "$mem" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
flops_token, peak, state, mem = float(sys.argv[2]), float(sys.argv[3]) * 1e12, int(sys.argv[4]), int(sys.argv[5])
gb = lambda b: f"{b / 1e9:.1f} GB"
print("step | step_s | tokens/s | model TFLOP/s | of peak | optimizer_s | wait_io_s | nvme read / written GB | loss")
frac = {}
for l in lines:
    t = l.get("time_s", {})
    n = l.get("nvme_bytes", [{}])[0]
    tf = l["tokens_per_s"] * flops_token
    frac[l["step"]] = tf / peak
    print(f"{l['step']:4d} | {l['step_s']:6.1f} | {l['tokens_per_s']:8.0f} | {tf / 1e12:13.1f} | {tf / peak:7.3f} | "
          f"{t.get('optimizer', 0):11.1f} | {t.get('wait_io', 0):9.1f} | "
          f"{n.get('read', 0) / 1e9:6.1f} / {n.get('written', 0) / 1e9:6.1f} | {l['loss']:.4f}")
r0 = lines[-1]["ledger"][0]
print(f"peak device {gb(r0['peak_device_bytes'])} of {gb(mem)}; peak host {gb(r0['peak_host_bytes'])}; "
      f"peak RSS {gb(r0['peak_rss_bytes'])}; state {gb(state)} = {state / mem:.3f} x the device's memory")
losses = [l["loss"] for l in lines]
falling = all(b < a for a, b in zip(losses, losses[1:]))
print(("losses fall: " if falling else "losses do NOT fall: ") + " -> ".join(f"{x:.4f}" for x in losses))
steady = [v for k, v in frac.items() if k >= 2]  # step 1 holds the start (first touches, fresh extents)
best = max(steady) if steady else 0
ok = falling and best >= 0.30 and state >= 1.15 * mem
print(("PASS" if ok else "FAIL") + f": state {state / mem:.3f} x memory (>= 1.15), losses {'fall' if falling else 'do not fall'}, "
      f"best steady step {best:.3f} of the dense bf16 peak (>= 0.30)")
sys.exit(0 if ok else 1)
EOF

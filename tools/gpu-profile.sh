#!/usr/bin/env bash
# Nsight Compute on the GPU machine, after `tools/gpu-check.sh` (or its --build-only) built build-gpu/:
#   tools/gpu-profile.sh OUTDIR
# writes OUTDIR/ncu_adam.txt (the Adam kernel of `zoe bench gpu`, one launch past the warm-up:
# speed of light, occupancy, launch, warp stalls, memory and compute sections), OUTDIR/ncu_gpt2.txt
# (every kernel of a 2-step GPT-2 124M job, B8 T1024 fp32, stage 0: the time of each kernel name,
# summed) and OUTDIR/ncu_gpt2_bf16.txt (the same job with bf16 weights and compute). ncu needs the
# machine's counters (Firecracker runtimes have them; gVisor's do not) and
# runs with --clock-control none (the clocks as the driver sets them). Each part has a timeout;
# ZOE_PROFILE_PARTS="gpt2_bf16" (any of adam gpt2 gpt2_bf16) runs only those.
set -uo pipefail
[[ $# == 1 ]] || { echo "usage: tools/gpu-profile.sh OUTDIR" >&2; exit 2; }
REPO=$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")
OUT=$1
ZOE=$REPO/build-gpu/zoe
[[ -x $ZOE ]] || { echo "no $ZOE: run tools/gpu-check.sh first" >&2; exit 2; }
mkdir -p "$OUT" || exit 1
# shellcheck source=gpu-check.sh
source "$REPO/tools/gpu-check.sh" --lib
deps_env "$REPO/build-gpu/deps"
nccl_env >/dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)
[[ -x ${NCU:-} ]] || { echo "no ncu on this machine" >&2; exit 2; }
NCU=("$NCU" --clock-control none)
rc=0

# ZOE_PROFILE_PARTS: which of adam, gpt2, gpt2_bf16 to run (default all three).
PARTS=" ${ZOE_PROFILE_PARTS:-adam gpt2 gpt2_bf16} "
[[ $PARTS == *" adam "* ]] && { timeout 150 "${NCU[@]}" --kernel-name regex:adam_kernel --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  "$ZOE" bench gpu --no-torch --iters 3 >"$OUT/ncu_adam.txt" 2>&1 || { echo "ncu adam: exit $?"; rc=1; }; }

# gpt2_step NAME ARGS...: every kernel of a 2-step GPT-2 124M job (B8 T1024, stage 0), summed per name.
gpt2_step() {
  local name=$1
  shift
  timeout 200 "${NCU[@]}" --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$ZOE" train --quiet --set zoe.device='"cuda"' --set zoe.model.type='"gpt2"' --set zoe.model.n_layer=12 \
    --set zoe.model.n_embd=768 --set zoe.model.n_head=12 --set zoe.model.n_positions=1024 \
    --set zoe.model.vocab_size=50257 --set zoe.data.seq_len=1024 --set train_micro_batch_size_per_gpu=8 \
    --set zero_optimization.stage=0 --set zero_optimization.offload_param.device='"none"' \
    --set zero_optimization.offload_optimizer.device='"none"' --set zoe.device_memory_budget=64000000000 \
    --set zoe.steps=2 --set zoe.checkpoint.dir='""' "$@" >"$OUT/$name.txt" 2>&1 || { echo "ncu $name: exit $?"; rc=1; }
}
[[ $PARTS == *" gpt2 "* ]] && gpt2_step ncu_gpt2 --set bf16.enabled=false
# bf16 weights and bf16 compute (the bench's bf16 row): cuBLASLt's tensor-core products beside
# zoe's own attention and elementwise kernels.
[[ $PARTS == *" gpt2_bf16 "* ]] && gpt2_step ncu_gpt2_bf16 --set bf16.enabled=true --set zoe.compute_dtype='"bf16"'
exit $rc

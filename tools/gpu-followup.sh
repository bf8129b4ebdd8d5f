#!/usr/bin/env bash
# The second device call of a GPU lease, on the machine `tools/gpu-check.sh OUTDIR` left warm with
# build-gpu/ built: the checks gpu-check's 440 s leaves out, in the open issues' order, each under
# its timeout and the whole under ZOE_FOLLOWUP_TOTAL_S (280 s: a lease's 15 minutes less the
# machine's start and gpu-check); a step that the time left cannot hold is skipped, not started.
# Writes OUTDIR/followup.md (each step's status, seconds and last lines) and OUTDIR/followup.log.
#
#   tools/gpu-followup.sh OUTDIR [STEP...]      STEP: python, wrap, offload, beyond_hbm, plan,
#                                               deepspeed (default: all six, in that order)
#   python      tests/python/torch_parity.py --device cuda: zoe.torch.wrap on the GPU against plain
#               PyTorch (stages 0 and 3, and 3 on NVMe), the path Hugging Face / Accelerate /
#               Lightning users take (build-gpu/python, built by gpu-check where pybind11 travelled)
#   wrap        bench/torch_wrap_step.py --device cuda: that path's GPT-2 124M step against plain
#               PyTorch's, with zoe_set_stream's events and with host waits
#   offload     zoe bench offload --device cuda: the GPU's offloaded step against its bound (issue 48)
#   beyond_hbm  bench/beyond_hbm.sh: a model 1.15x the GPU's memory at a fraction of its peak (48)
#   plan        bench/plan_check.py --no-grid: `zoe plan`'s choice on the GPU, predicted against
#               measured (issue 50; GPT-2 124M, a 1 GiB device budget)
#   deepspeed   bench/deepspeed_peer.sh: DeepSpeed ZeRO-Infinity beside zoe (48; its install, op
#               builds and four runs want a device call of their own, after gpu-check --build-only:
#               ZOE_FOLLOWUP_TOTAL_S=560 tools/gpu-followup.sh OUT deepspeed; .gpudeps/deepspeed
#               carried)
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $1 != -* ]] || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
out=$(mkdir -p "$1" && readlink -f "$1") || { echo "gpu-followup: cannot create $1" >&2; exit 2; }
shift
steps=("$@")
((${#steps[@]})) || steps=(python wrap offload beyond_hbm plan deepspeed)
zoe=build-gpu/zoe
[[ -x $zoe ]] || { echo "gpu-followup: no $zoe: run tools/gpu-check.sh OUTDIR on this machine first" >&2; exit 2; }
# gpu-check's choice of the bf16 attention's kernels (zoe's own where cuDNN's failed its test)
# shellcheck disable=SC1091
[[ -f build-gpu/attention.env ]] && source build-gpu/attention.env
total=${ZOE_FOLLOWUP_TOTAL_S:-280}
log=$out/followup.log
: >"$log"
# gpu-check's environment (this is a new shell): the carried prefix (MPI, its libraries), NCCL's and
# cuDNN's folders, the python3 that holds PyTorch.
# shellcheck disable=SC1091
source tools/gpu-check.sh --lib && add_python_bin && deps_env "$PWD/build-gpu/deps" &&
  { nccl_env; cudnn_env; } >>"$log" 2>&1
summary=("# zoe GPU follow-up ($(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ))" ""
         "| step | status | seconds | limit |" "|---|---|---|---|")
details=()

step_cmd() {
  local parity="PYTHONPATH=build-gpu/python python3 tests/python/torch_parity.py --device cuda"
  case $1 in
    python) echo "if ! compgen -G 'build-gpu/python/zoe/_zoe*.so' >/dev/null; then" \
                 "grep -q '^ZOE_PYTHON_FOUND:INTERNAL=ON' build-gpu/CMakeCache.txt ||" \
                 "{ echo 'SKIP: build-gpu has no Python package (no pybind11 carried, or no Python headers here)'; exit 77; };" \
                 "cmake --build build-gpu -j \${ZOE_JOBS:-16} --target zoe_python || exit 1; fi;" \
                 "$parity --stage 0 && $parity --stage 3 && $parity --stage 3 --nvme $out/python-nvme &&" \
                 "PYTHONPATH=build-gpu/python python3 tests/python/gpu_placement.py" ;;
    wrap) echo "compgen -G 'build-gpu/python/zoe/_zoe*.so' >/dev/null || { echo 'SKIP: no Python package'; exit 77; };" \
               "PYTHONPATH=build-gpu/python python3 bench/torch_wrap_step.py --device cuda --json $out/torch_wrap.json" ;;
    offload) echo "$zoe bench offload --device cuda --json --dir $out/offload-swap > $out/offload.json &&" \
                  "python3 -m json.tool $out/offload.json" ;;
    beyond_hbm) echo "BHBM_ZOE=$zoe bench/beyond_hbm.sh $out/beyond-hbm" ;;
    plan) echo "python3 bench/plan_check.py --zoe $zoe --out $out/plan --config bench/plan_jobs/gpt2_124m.json" \
               "--set 'zoe.device=\"cuda\"' --set gradient_clipping=0 --no-grid --steps 5" ;;
    deepspeed) echo "bench/deepspeed_peer.sh $out/peer" ;;
    *) return 1 ;;
  esac
}
step_limit() { case $1 in python) echo 90 ;; wrap) echo 120 ;; offload) echo 120 ;; beyond_hbm) echo 240 ;; plan) echo 150 ;; deepspeed) echo 540 ;; *) echo 300 ;; esac; }

failed=0
for s in "${steps[@]}"; do
  cmd=$(step_cmd "$s") || { echo "gpu-followup: unknown step '$s'" >&2; exit 2; }
  limit=$(step_limit "$s")
  left=$((total - SECONDS))
  if ((left < limit / 2)); then  # half its limit at least, or it would only time out
    summary+=("| $s | skipped: ${left} s left | 0 | $limit |")
    continue
  fi
  ((limit > left)) && limit=$left
  from=$(($(stat -c %s "$log") + 1))
  echo "=== $s (limit $limit s): $cmd" >>"$log"
  start=$SECONDS
  timeout -k 10 "$limit" bash -c "$cmd" >>"$log" 2>&1
  rc=$?
  case $rc in 0) status=passed ;; 77) status="skipped" ;; 124 | 137) status="timeout" ;; *) status="failed (exit $rc)" ;; esac
  [[ $status == passed || $status == skipped ]] || failed=1
  summary+=("| $s | $status | $((SECONDS - start)) | $limit |")
  details+=("" "## $s" "\`$cmd\`" "" '```' "$(tail -c +"$from" "$log" | tail -n 40)" '```')
done
printf '%s\n' "${summary[@]}" "${details[@]}" >"$out/followup.md"
echo "gpu-followup: wrote $out/followup.md and $out/followup.log"
exit $failed

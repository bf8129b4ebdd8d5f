#!/usr/bin/env bash
# The out-of-core run (a benchmark, not a test): a GPT-2-shaped model whose 16-bytes-per-parameter
# training state is at least twice this machine's RAM trains 4 steps (OOC_STEPS) on one rank, bf16,
# stage 3, with the optimizer state and the parameters on NVMe. Prints the ledger per tier, the peak RSS,
# the time per step split into compute, NVMe reads and NVMe writes, and each step's NVMe bytes
# against the disk (and the disk's own counters over the step: rates, utilisation, requests in
# flight): its bound is those bytes at the rates `zoe bench nvme` measures in the same
# directory before the run and again after it (1 MiB blocks, depth 32, as the job's aio settings;
# a 16 GiB file, the scale at which the disk's rates hold for a step's ~97 GB), reads then writes;
# the ratio is to the mean of the two bounds. Steady steps are 3 on: step 2 holds the first update,
# whose reads of exp_avg and exp_avg_sq are zeros the store makes without a request (never written)
# and whose writes fill the files' fresh extents for the first time.
# The update runs after the backward with clipping at 1.0 (OOC_CLIP); OOC_UPDATE_IN_BACKWARD=1 runs
# it during the backward instead (zoe.update_in_backward: each unit's Adam, with its NVMe reads and
# writes, as soon as its gradient is final), speculatively: a step whose norm the clip bites is
# taken back and redone, one more pass over the state (the report's grad_norm says which).
# The learning rate warms up linearly from 2e-6 (WarmupLR, 1000 steps to 1e-4), so the three
# losses fall; the script says whether they did. Wide deep models on 64 tokens a step rise under
# a larger first lr, in PyTorch as in zoe (bench/history.md): 14 layers at width 2560 went
# 11.31 -> 11.55 -> 12.84 in torch at 2e-5 (zoe 11.01 -> 11.96 -> 12.41) and fell at 2e-6
# (11.31 -> 9.50 -> 7.89); this 40-layer model rose at 2e-5 and 5e-6.
#
#   bench/out_of_core.sh [DIR] [--set key=value ...]    (DIR default: out/ooc; build first: tools/build.sh)
#   OOC_STEPS, OOC_LAYERS/EMBD/HEADS/VOCAB/SEQ, OOC_RATE_BYTES, OOC_CLIP, OOC_ZOE (the binary, default build/zoe)
#
# Default shape (24 GiB machines): n_layer 40, n_embd 2560, n_head 32, vocab 50257: 3.28 B params,
# 52.5 GB of state; 46 GB of it on NVMe (the bf16 gradient shard stays in memory: pinned host
# memory, where the CPU Adam reads it). The device budget (4 GiB) bounds what the scheduler keeps
# gathered, so the RSS (device + host: gradients, pinned pool) stays under a quarter.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-out/ooc}
zoe=${OOC_ZOE:-build/zoe}  # the binary (another build for an A/B run)
shift || true
steps=${OOC_STEPS:-4}
L=${OOC_LAYERS:-40} D=${OOC_EMBD:-2560} H=${OOC_HEADS:-32} V=${OOC_VOCAB:-50257} T=${OOC_SEQ:-64}
mkdir -p "$dir"
clip=${OOC_CLIP:-1.0}
if [ "${OOC_UPDATE_IN_BACKWARD:-0}" = 1 ]; then in_backward=true; else in_backward=false; fi
echo "update: $([ $in_backward = true ] && echo "during the backward (zoe.update_in_backward)" || echo "after the backward"), clipping at $clip"
params=$(( V * D + 1024 * D + L * (12 * D * D + 13 * D) + 2 * D ))
state=$(( 16 * params ))
on_disk=$(( 14 * params ))  # bf16 params + fp32 master, exp_avg, exp_avg_sq
ram=$(awk '/MemTotal/ {print $2 * 1024}' /proc/meminfo)
free=$(df --output=avail -B1 "$dir" | tail -1)
gb() { awk -v b="$1" 'BEGIN { printf "%.1f GB", b / 1e9 }'; }
echo "model: $params parameters; state $(gb $state) = $(awk -v s=$state -v r=$ram 'BEGIN{printf "%.2f", s/r}') x RAM ($(gb $ram));" \
     "NVMe needs $(gb $on_disk), free at $dir: $(gb $free)"
if (( free < on_disk + on_disk / 20 )); then
  echo "out_of_core: needs $(gb $(( on_disk + on_disk / 20 ))) free at $dir (the state plus 5%), has $(gb $free)" >&2
  exit 2
fi
cat > "$dir/config.json" <<EOF
{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": {"enabled": true},
  "gradient_clipping": $clip,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 2e-6, "warmup_max_lr": 1e-4,
    "warmup_num_steps": 1000, "warmup_type": "linear"}},
  "zero_optimization": {"stage": 3, "sub_group_size": 100000000,
    "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/nvme", "pin_memory": true},
    "offload_param": {"device": "nvme", "nvme_path": "$dir/nvme", "pin_memory": true}},
  "aio": {"block_size": 1048576, "queue_depth": 32},
  "zoe": {"device": "cpu", "device_memory_budget": "4GiB", "host_memory_budget": "9GiB",
    "model": {"type": "gpt2", "n_layer": $L, "n_head": $H, "n_embd": $D, "vocab_size": $V, "n_positions": 1024},
    "data": {"train": "data/corpus.txt", "format": "bytes", "seq_len": $T},
    "steps": $steps, "update_in_backward": $in_backward}
}
EOF
# The disk's rates in this directory, now, at the job's block size and depth and at the job's
# scale: a step moves ~97 GB, and this disk sustains less than it takes in a burst (1 GiB files:
# write 5.9 GB/s; a 30 GB overwrite, fio: 3.95-4.59, falling from 5.3 to 2.9 GB/s within it).
# A 16 GiB file, one rep (a pass of 16 GiB is its own average), no checksum rows (the bound does
# not use them): what each step's bound is made of.
# Measured before the run and again after it (the job's files gone by then): this disk's rates
# drift by tens of percent within minutes (write 3.9-6.4 GB/s on one day), so each step is held
# against both bounds and their mean.
rate_bytes=${OOC_RATE_BYTES:-17179869184}
# Beside them, fio's rate for reads and writes at once (50/50, 1 MiB, depth 32, 15 s on a 4 GiB
# file, buffers as zoe bench nvme's referee): an update pass moves both together, and a disk may
# move a mix slower than the two apart.
measure_rates() {
  "$zoe" bench nvme --dir "$dir/rate" --size "$rate_bytes" --aio-block-size 1048576 --aio-queue-depth 32 \
    --iters "${OOC_RATE_ITERS:-1}" --no-checksums --json > "$1"
  rm -rf "$dir/rate"
  if command -v fio >/dev/null; then  # the file written once first (a fresh file's extents are slower)
    mkdir -p "$dir/rate"
    local fio_job=(--name=mixed --directory="$dir/rate" --size=4G --bs=1M --iodepth=32 --ioengine=io_uring
                   --direct=1 --fixedbufs=1 --registerfiles=1 --iomem_align=2m --output-format=json)
    if GLIBC_TUNABLES=glibc.malloc.hugetlb=1 fio "${fio_job[@]}" --rw=write >/dev/null 2>&1; then
      GLIBC_TUNABLES=glibc.malloc.hugetlb=1 fio "${fio_job[@]}" --rw=rw --rwmixread=50 --runtime=15 --time_based=1 \
        > "$1.mixed" 2>/dev/null || rm -f "$1.mixed"
    fi
    rm -rf "$dir/rate"
  fi
}
measure_rates "$dir/nvme_rate.json"
start=$(date +%s)
# The disk's counters beside the run, tagged with the step in progress (bench/disk_sampler.py):
# each step's rates, utilisation and requests in flight print beside its bound.
rm -f "$dir/report.jsonl"
python3 bench/disk_sampler.py sample "$dir" "$dir/report.jsonl" "$dir/disk.jsonl" 0.25 &
sampler=$!
trap 'kill $sampler 2>/dev/null || true' EXIT
"$zoe" train --config "$dir/config.json" --report "$dir/report.jsonl" "$@"
echo "total wall time (start-up, init, every step): $(( $(date +%s) - start )) s"
kill $sampler 2>/dev/null || true
disk=$(python3 bench/disk_sampler.py summarize "$dir/disk.jsonl")
measure_rates "$dir/nvme_rate_after.json"
python3 - "$dir/report.jsonl" "$state" "$dir/nvme_rate.json" "$dir/nvme_rate_after.json" "$disk" <<'EOF'
import json, sys
disk = json.loads(sys.argv[5])
lines = [json.loads(l) for l in open(sys.argv[1]) if '"ledger"' in l]
state = int(sys.argv[2])
def rates(path):
    j = json.load(open(path))
    return j.get("file_bytes", 0), {r["op"]: r["zoe_GBps"] * 1e9 for r in j["results"]
                                    if r["block_bytes"] == 1 << 20 and r["queue_depth"] == 32}
measured = [rates(p) for p in sys.argv[3:5]]
def mixed(path):  # fio's reads + writes at once, GB/s together (None without fio)
    try:
        j = json.load(open(path + ".mixed"))["jobs"][0]
        return (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e9
    except (OSError, ValueError, KeyError, IndexError):
        return None
mixes = [m for m in (mixed(p) for p in sys.argv[3:5]) if m]
gb = lambda b: f"{b / 1e9:.2f} GB"
r0 = lines[-1]["ledger"][0]
for tier in ("device", "host", "nvme"):
    print(f"ledger {tier:6s}: " + ", ".join(f"{k} {gb(v)}" for k, v in r0[tier].items()))
print(f"peak device {gb(r0['peak_device_bytes'])}, peak host {gb(r0['peak_host_bytes'])}, "
      f"peak RSS {gb(r0['peak_rss_bytes'])} = {r0['peak_rss_bytes'] / state:.3f} of the state ({gb(state)})")
for when, (file_bytes, rate) in zip(("before the run", "after it"), measured):
    print(f"disk {when} (zoe bench nvme, 1 MiB blocks, depth 32, {file_bytes / 2**30:.0f} GiB file, this directory): "
          f"read {rate['read'] / 1e9:.2f} GB/s, write {rate['write'] / 1e9:.2f} GB/s")
if mixes:
    print("disk reads and writes at once (fio, 50/50, 1 MiB, depth 32), before / after: "
          + " / ".join(f"{m:.2f}" for m in mixes) + " GB/s together")
print("step | step_s | compute_s | nvme_read_s | nvme_write_s | wait_comm_s | read GB | written GB | "
      "bound_s before / after | step/bound (mean bound) | disk read / write GB/s, busy, in flight | loss")
def disk_text(step):
    d = disk.get(str(step))
    return (f"{d['read_GBps']:4.2f} / {d['write_GBps']:4.2f}, {d['busy']:4.2f}, {d['in_flight']:5.1f}" if d
            else "(no samples)")
ratio = {}
for l in lines:
    t, n = l["time_s"], l["nvme_bytes"][0]
    compute = l["step_s"] - t["wait_io"] - t["wait_comm"]
    bounds = [n["read"] / rate["read"] + n["written"] / rate["write"] for _, rate in measured]
    mean = sum(bounds) / len(bounds)
    ratio[l["step"]] = l["step_s"] / mean
    print(f"{l['step']:4d} | {l['step_s']:6.1f} | {compute:9.1f} | {t['nvme_read']:11.1f} | {t['nvme_write']:12.1f} | "
          f"{t['wait_comm']:11.1f} | {n['read'] / 1e9:7.2f} | {n['written'] / 1e9:10.2f} | "
          f"{bounds[0]:6.1f} / {bounds[1]:5.1f} | {ratio[l['step']]:23.2f} | {disk_text(l['step'])} | {l['loss']:.4f}")
if mixes:  # the step's bytes at the mixed rate: how close an interleaved pass could come
    mix = sum(mixes) / len(mixes)
    print("step/(its bytes at the mixed rate): " + ", ".join(
        f"{l['step']}: {l['step_s'] / ((l['nvme_bytes'][0]['read'] + l['nvme_bytes'][0]['written']) / 1e9 / mix):.2f}"
        for l in lines))
steady = {k: v for k, v in ratio.items() if k >= 3}
if steady:
    print(f"steady steps (3 on; step 1 holds the start, step 2 the first update, which writes exp_avg and exp_avg_sq "
          f"for the first time: their reads are zeros without a request, their writes fill fresh extents): "
          + ", ".join(f"{v:.2f}" for v in steady.values()) + f"; the largest {max(steady.values()):.2f} "
          + ("<=" if max(steady.values()) <= 1.25 else ">") + " 1.25")
losses = [l["loss"] for l in lines]
falling = all(b < a for a, b in zip(losses, losses[1:]))
print(("losses fall: " if falling else "losses do NOT fall: ") + " -> ".join(f"{x:.4f}" for x in losses))
ok = r0["peak_rss_bytes"] < state / 4
print(("PASS" if ok else "FAIL") + f": peak RSS {'<' if ok else '>='} a quarter of the state")
sys.exit(0 if ok else 1)
EOF

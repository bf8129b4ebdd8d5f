#!/usr/bin/env python3
"""`zoe plan` against measured steps, and against a grid search over the same knobs.

Runs `zoe plan --json` for a job, then trains for a few steps each the plan's choice and a grid
over the same knobs (stage 0 and 3; optimizer on the device, in host memory or on NVMe; at stage
3 the parameters on the device or on NVMe; the smallest and largest micro-batch; checkpointing
off and on; the rest at zoe's defaults). Prints per configuration the predicted and the measured
step (median of the steps after the first), their ratio, the device bytes predicted and peaked,
and whether the plan's choice is no slower than the grid's best, with the grid's cost.

  bench/plan_check.py --zoe build/zoe --out out/plan-check [--config C.json] [--set k=v]... \
      [--grid-micro ends] [--steps 6]
  bench/plan_check.py ... --config job.json --model-work work.json \
      --runner "python3 bench/wrapped_model.py train --layers 6"     (a model trained through zoe.torch.wrap)
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time


def knob_sets(p, nvme_path):
    s = [f"zero_optimization.stage={p['stage']}",
         f"zero_optimization.offload_optimizer.device=\"{'none' if p['offload_optimizer'] == '-' else p['offload_optimizer']}\"",
         f"zero_optimization.offload_optimizer.ratio={p['optimizer_ratio']}",
         f"zero_optimization.offload_param.device=\"{'none' if p['offload_param'] == '-' else p['offload_param']}\"",
         f"zero_optimization.offload_param.ratio={p['param_ratio']}",
         f"zero_optimization.sub_group_size={p['sub_group_size']}",
         f"zero_optimization.stage3_prefetch_bucket_size={p['prefetch_bucket_size']}",
         f"zero_optimization.stage3_max_reuse_distance={p['max_reuse_distance']}",
         f"train_micro_batch_size_per_gpu={p['micro_batch']}",
         f"gradient_accumulation_steps={p['accumulation']}",
         f"zoe.activation_checkpointing={'true' if p['activation_checkpointing'] else 'false'}",
         f"zoe.update_in_backward={'true' if p.get('update_in_backward') else 'false'}"]
    if nvme_path:
        s += [f"zero_optimization.offload_optimizer.nvme_path=\"{nvme_path}\"",
              f"zero_optimization.offload_param.nvme_path=\"{nvme_path}\""]
    return s


MPIRUN = ["mpirun", "--oversubscribe", "-x", "OMPI_MCA_btl=self,vader"]


def ranks_prefix(a):
    return MPIRUN + ["-np", str(a.ranks)] if a.ranks > 1 else []


def run_steps(a, sets, report):
    if a.runner:  # a wrapped model: the runner trains it with the config and the knobs' --sets
        cmd = ranks_prefix(a) + shlex.split(a.runner) + ["--config", a.config, "--report", report, "--steps",
                                                         str(a.steps)]
        extra = []
    else:
        cmd = ranks_prefix(a) + [a.zoe, "train", "--quiet", "--report", report]
        if a.config:
            cmd += ["--config", a.config]
        extra = [f"zoe.steps={a.steps}", "zoe.checkpoint.dir=\"\"", "zoe.eval_every=0"]
    for s in a.set + sets + extra:
        cmd += ["--set", s]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}", time.time() - t0
    steps = [x for x in map(json.loads, open(report)) if "step_s" in x]
    peak = max(x["ledger"][0]["peak_device_bytes"] for x in steps)
    return (statistics.median(x["step_s"] for x in steps[1:]), peak), "", time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoe", default="build/zoe")
    ap.add_argument("--config", default="")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", default="out/plan-check")
    ap.add_argument("--grid-micro", choices=["ends", "all"], default="ends",
                    help="micro-batches in the grid: the smallest and the largest, or all")
    ap.add_argument("--grid-ratios", default="1", help="offload ratios in the grid, comma-separated (e.g. 1,0.5)")
    ap.add_argument("--no-grid", action="store_true", help="only the plan's choice (and --as-given)")
    ap.add_argument("--as-given", action="store_true",
                    help="also train the job's config as given, beside its prediction where the plan has one")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ranks", type=int, default=1, help="ranks (mpirun -np; as root set OMPI_ALLOW_RUN_AS_ROOT)")
    ap.add_argument("--rematch", type=int, default=3,
                    help="runs each of the plan's choice and the grid's best, taking turns, when they differ")
    ap.add_argument("--nvme-path", default="", help="the swap path the job's plans use (default: the config's)")
    ap.add_argument("--model-work", default="",
                    help="a described model (zoe.torch.describe's file) for zoe plan, in place of the config's GPT-2")
    ap.add_argument("--runner", default="",
                    help="with --model-work: the command that trains that model (bench/wrapped_model.py train ...)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cmd = ranks_prefix(a) + [a.zoe, "plan", "--json", "--top", "100000", "--out", f"{a.out}/plan.json", "--cache",
           f"{a.out}/calibration.json"]
    if a.config:
        cmd += ["--config", a.config]
    if a.model_work:
        cmd += ["--model-work", a.model_work]
    for s in a.set:
        cmd += ["--set", s]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    plan_s = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"zoe plan failed: {r.stderr.strip()}")
    plans = json.loads(r.stdout)["plans"]
    planned = json.load(open(f"{a.out}/plan.json"))
    zo = planned.get("zero_optimization", {})
    nvme_path = a.nvme_path or zo.get("offload_optimizer", {}).get("nvme_path", "") or \
        zo.get("offload_param", {}).get("nvme_path", "")
    # The grid: every stage 0 and 3 placement of the optimizer (device, host, NVMe) and, at stage 3,
    # of the parameters (device, NVMe), at the smallest and largest micro-batch, with and without
    # checkpointing; the other knobs at zoe's defaults. Each point's prediction is the plan's own
    # row for it; points the plan refuses are counted, not run.
    mbs = sorted({p["micro_batch"] for p in plans})
    ckpts = sorted({p["activation_checkpointing"] for p in plans})  # a described model may offer one
    ratios = [float(r) for r in a.grid_ratios.split(",")]
    default = lambda p: p["sub_group_size"] == 1_000_000_000 and p["prefetch_bucket_size"] == 50_000_000 and \
        p["max_reuse_distance"] == 1_000_000_000
    wanted = set()
    for stage in (0, 3):
        for opt in ("-", "cpu", "nvme"):
            for orat in ratios if opt != "-" else (1,):
                for par in (("-", "cpu", "nvme") if stage == 3 else ("-",)):
                    for prat in ratios if par != "-" else (1,):
                        for b in (mbs[0], mbs[-1]) if a.grid_micro == "ends" else mbs:
                            for ck in ckpts:
                                wanted.add((stage, opt, orat, par, prat, b, ck))
    grid = [plans[0]]
    for p in plans[1:] if not a.no_grid else []:
        key = (p["stage"], p["offload_optimizer"], p["optimizer_ratio"], p["offload_param"], p["param_ratio"],
               p["micro_batch"], p["activation_checkpointing"])
        if key in wanted and default(p):
            grid.append(p)
            wanted.discard(key)
    refused = len(wanted)
    print(f"# zoe plan: {len(plans)} configurations fit; plan took {plan_s:.1f} s; the plan's choice (#1) and a "
          f"grid of {len(grid) - 1} ({refused} more refused by the plan), {a.steps} steps each")
    print("| # | stage | optimizer | params | B x acc | ckpt | predicted s | measured s | measured / predicted "
          "| device MB predicted / peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows, grid_s = [], 0
    for i, p in enumerate(grid):
        mp, err, took = run_steps(a, knob_sets(p, nvme_path), f"{a.out}/report_{i}.jsonl")
        m, peak = mp if mp else (None, 0)
        grid_s += took
        home = lambda h, r: h if h == "-" or r == 1 else f"{h} {r:g}"
        ratio = f"{m / p['step_s']:.2f}" if m else err
        print(f"| {i + 1} | {p['stage']} | {home(p['offload_optimizer'], p['optimizer_ratio'])} | "
              f"{home(p['offload_param'], p['param_ratio'])} | {p['micro_batch']} x {p['accumulation']} | "
              f"{'yes' if p['activation_checkpointing'] else 'no'} | {p['step_s']:.3f} | "
              f"{m:.3f} | {ratio} | {p['device_bytes'] / 1e6:.0f} / {peak / 1e6:.0f} |" if m else f"| {i + 1} | {p['stage']} | ... | | | | {p['step_s']:.3f} | - | {err} |",
              flush=True)
        rows.append((p, m))
    if a.as_given:
        m, err, took = run_steps(a, [], f"{a.out}/report_given.jsonl")
        print(f"| given | the job's config as written | | | | | - | {m[0]:.3f} | - | - / {m[1] / 1e6:.0f} |" if m
              else f"| given | the job's config | {err} |", flush=True)
    done = [(p, m) for p, m in rows if m]
    if done:
        best_i = min((i for i, (p, m) in enumerate(rows) if m), key=lambda i: rows[i][1])
        best = rows[best_i]
        chosen = rows[0][1]
        print(f"# the plan's choice measured {chosen:.3f} s; the grid's best {best[1]:.3f} s "
              f"(#{best_i + 1}): {chosen / best[1]:.2f}x; the grid cost {grid_s:.0f} s of runs")
        if best_i != 0 and chosen and a.rematch:
            # One run each is noisy on a shared VM: the two again, taking turns, medians.
            again = {0: [], 1: []}
            for r in range(a.rematch):
                for side, p in ((0, rows[0][0]), (1, best[0])):
                    m, _, _ = run_steps(a, knob_sets(p, nvme_path), f"{a.out}/rematch.jsonl")
                    if m:
                        again[side].append(m[0])
            if again[0] and again[1]:
                c, b = statistics.median(again[0]), statistics.median(again[1])
                print(f"# rematch, {a.rematch} runs each taking turns: the plan's choice {c:.3f} s, the grid's best "
                      f"{b:.3f} s: {c / b:.2f}x")


if __name__ == "__main__":
    main()

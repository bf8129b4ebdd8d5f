#!/usr/bin/env python3
"""Writes tests/data/lr_golden.json: the learning rate of every optimizer step under DeepSpeed's
own WarmupLR / WarmupCosineLR classes, stepped as DeepSpeed's engine steps them (built at
iteration -1; optimizer.step() with the current lr, then lr_scheduler.step()).

Needs torch and deepspeed importable (DeepSpeed 0.19.8 was used; `pip install --no-deps
--target DIR deepspeed==0.19.8` plus pydantic, hjson, py-cpuinfo, psutil, msgpack, tqdm, einops,
packaging, then PYTHONPATH=DIR)."""
import json
import os
import sys

import torch
import deepspeed
from deepspeed.runtime.lr_schedules import WarmupCosineLR, WarmupLR

LR = 3e-3  # optimizer.params.lr
STEPS = 40
CASES = [
    ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": LR, "warmup_num_steps": 10, "warmup_type": "log"}),
    ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": LR, "warmup_num_steps": 10, "warmup_type": "linear"}),
    ("WarmupLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": LR, "warmup_num_steps": 1, "warmup_type": "linear"}),
    ("WarmupCosineLR", {"total_num_steps": 30, "warmup_num_steps": 10, "warmup_type": "linear", "cos_min_ratio": 0.1}),
    ("WarmupCosineLR", {"total_num_steps": 30, "warmup_num_steps": 10, "warmup_type": "log",
                        "warmup_min_ratio": 0.1, "cos_min_ratio": 1e-4}),
    ("WarmupCosineLR", {"total_num_steps": 5, "warmup_num_steps": 8, "warmup_type": "linear", "cos_min_ratio": 0.2}),
    ("WarmupCosineLR", {"total_num_steps": 25, "warmup_num_steps": 1, "warmup_type": "log", "cos_min_ratio": 0.0}),
]


def lrs(kind, params):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=LR)
    sched = (WarmupLR if kind == "WarmupLR" else WarmupCosineLR)(opt, **params)
    out = []
    for _ in range(STEPS):
        out.append(opt.param_groups[0]["lr"])  # the lr this optimizer step runs with
        opt.step()
        sched.step()
    return out


def main():
    cases = [{"type": k, "params": p, "lr": LR, "lrs": lrs(k, p)} for k, p in CASES]
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "data", "lr_golden.json")
    with open(path, "w") as f:
        json.dump({"deepspeed": deepspeed.__version__, "torch": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

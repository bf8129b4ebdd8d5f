#!/usr/bin/python3
"""Writes tests/data/adam_golden.json: torch.optim.AdamW and torch.optim.Adam on small fp32
tensors, with every step's gradients, so tests/adam_test.cc can check zoe against torch.

Run with Debian's python3-torch:  /usr/bin/python3 tools/gen_adam_golden.py
"""
import json
import os
import sys

import torch

TENSORS = 3
ELEMS = 37          # odd: exercises vector tails
STEPS = 5
HYPER = dict(lr=3e-3, betas=(0.85, 0.995), eps=1e-6, weight_decay=0.1)


def run(opt_class, seed):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(ELEMS, generator=gen, dtype=torch.float32) for _ in range(TENSORS)]
    initial = [p.tolist() for p in params]
    params = [torch.nn.Parameter(p) for p in params]
    # foreach=False: the single-tensor path, whose op order is the documented formula.
    opt = opt_class(params, foreach=False, **HYPER)
    grads = []
    for _ in range(STEPS):
        step_grads = []
        for p in params:
            # Gradients of a few magnitudes, some near zero, so m and v see cancellation.
            p.grad = torch.randn(ELEMS, generator=gen, dtype=torch.float32) * 0.5
            step_grads.append(p.grad.tolist())
        opt.step()
        grads.append(step_grads)
    state = [opt.state[p] for p in params]
    return {
        "optimizer": opt_class.__name__,
        "decoupled": opt_class is torch.optim.AdamW,
        "initial_params": initial,
        "grads": grads,                      # [step][tensor][element]
        "final_params": [p.detach().tolist() for p in params],
        "final_exp_avg": [s["exp_avg"].tolist() for s in state],
        "final_exp_avg_sq": [s["exp_avg_sq"].tolist() for s in state],
    }


def main():
    torch.set_num_threads(1)
    out = {
        "generator": "tools/gen_adam_golden.py",
        "torch_version": torch.__version__,
        "lr": HYPER["lr"], "beta1": HYPER["betas"][0], "beta2": HYPER["betas"][1],
        "eps": HYPER["eps"], "weight_decay": HYPER["weight_decay"], "steps": STEPS,
        "cases": [run(torch.optim.AdamW, 1), run(torch.optim.Adam, 2)],
    }
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "data", "adam_golden.json")
    with open(path, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}", file=sys.stderr)


if __name__ == "__main__":
    main()

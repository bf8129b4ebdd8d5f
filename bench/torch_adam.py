#!/usr/bin/python3
"""Times torch.optim.AdamW steps on one fp32 tensor of --n elements with --threads threads, for
`zoe bench adam`. Tries the single-tensor, foreach and (if this torch has it on CPU) fused
implementations on warmed buffers; prints one JSON line: {"ok": ..., "variants": {name:
{"best_s", "median_s"} or {"error"}}}. Without torch it prints {"ok": false, "why": ...}.
"""
import argparse
import json
import statistics
import sys
import time


def time_variant(torch, param, kwargs, iters):
    opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, **kwargs)
    opt.step()  # warm-up: creates exp_avg / exp_avg_sq and the step's temporaries
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    del opt
    return {"best_s": min(times), "median_s": statistics.median(times)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch
    except Exception as e:  # noqa: BLE001 -- any import failure means "no torch here"
        print(json.dumps({"ok": False, "why": f"cannot import torch with {sys.executable}: {e}"}))
        return 0
    torch.set_num_threads(a.threads)
    with torch.no_grad():
        param = torch.nn.Parameter(torch.empty(a.n, dtype=torch.float32).uniform_(-1, 1))
        param.grad = torch.empty(a.n, dtype=torch.float32).uniform_(-1, 1)
    variants = {}
    for name, kwargs in (("single_tensor", {"foreach": False}), ("foreach", {"foreach": True}),
                         ("fused", {"fused": True})):
        try:
            variants[name] = time_variant(torch, param, kwargs, a.iters)
        except (TypeError, RuntimeError, ValueError) as e:  # e.g. no fused AdamW on CPU
            variants[name] = {"error": str(e).splitlines()[0][:200]}
    print(json.dumps({"ok": True, "torch_version": torch.__version__, "n": a.n,
                      "threads": torch.get_num_threads(), "variants": variants}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""zoe.torch.wrap's training step against plain PyTorch's, same model, data and device, as a
Trainer / Accelerate / Lightning user runs it: bench/torch_gpt2_step.py's GPT-2 in plain PyTorch
(SDPA attention, a head tied to the token embedding), AdamW, bf16 autocast on a GPU. Rows, each
in its own turn in one process:
  torch       plain PyTorch: the model resident, torch.optim.AdamW (fused on a GPU)
  zoe         zoe.torch.wrap at --stage (0: resident too): torch's stream set as zoe's caller
              stream (zoe_set_stream), so fetches and gradient hand-overs are ordered by events
  zoe-waits   the same, the stream never set: each fetch and hand-over waits on the host (what
              zoe_set_stream removed; the figure says what it is worth)
Prints tokens/s per row and each zoe row against torch's; --json writes them. On the CPU it is a
smoke run (ctest python_bench_torch_wrap_smoke); on a GPU tools/gpu-followup.sh runs it.

  bench/torch_wrap_step.py [--device cuda] [--layers 12 --embd 768 --heads 12 --seq 1024
                           --batch 8 --vocab 50304] [--stage 0] [--steps 6] [--json OUT]
"""
import argparse
import json
import os
import sys
import time

import torch

from torch_gpt2_step import Gpt2

try:  # PYTHONPATH's (build-gpu/python on a lease), else this checkout's build
    import zoe
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
    import zoe
import zoe.torch  # noqa: E402

LR, WD = 3e-4, 0.1


def model_of(a):
    """The GPT-2 that `zoe bench step`'s PyTorch side trains (bench/torch_gpt2_step.py), this shape."""
    return Gpt2(argparse.Namespace(n_embd=a.embd, vocab_size=a.vocab, n_positions=a.seq, n_head=a.heads,
                                   n_layer=a.layers))


class HostWaits:
    """The engine with zoe_set_stream taken away: zoe.torch.wrap's calls then wait on the host."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return (lambda *args: None) if name == "set_stream" else getattr(self.engine, name)


def batches(a, n):
    """One random batch, n times: a loss that falls within a few steps (random tokens never fall)."""
    idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=torch.Generator().manual_seed(7))
    return [(idx[:, :-1].contiguous().to(a.device), idx[:, 1:].contiguous().to(a.device))] * n


def sync(a):
    if a.device == "cuda":
        torch.cuda.synchronize()


def timed(a, step, data):
    """Seconds a step over the last --steps of 2 + --steps steps, and the losses."""
    losses = []
    for i, (x, y) in enumerate(data):
        if i == 2:
            sync(a)
            t0 = time.perf_counter()
        losses.append(step(x, y))
    sync(a)
    return (time.perf_counter() - t0) / (len(data) - 2), losses


def autocast(a):
    return torch.autocast("cuda", dtype=torch.bfloat16) if a.device == "cuda" else torch.autocast("cpu", enabled=False)


def run_torch(a, data):
    torch.manual_seed(0)
    model = model_of(a).to(a.device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}], lr=LR,
                            **({"fused": True} if a.device == "cuda" else {}))

    def step(x, y):
        with autocast(a):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return timed(a, step, data)


def run_zoe(a, data, host_waits):
    torch.manual_seed(0)
    model = model_of(a).to(a.device)
    cfg = {"train_micro_batch_size_per_gpu": a.batch, "zero_optimization": {"stage": a.stage},
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
           "zoe": {"device": "cuda" if a.device == "cuda" else "cpu"}}
    engine = zoe.Engine(cfg)
    zoe.torch.wrap(model, HostWaits(engine) if host_waits else engine)

    def step(x, y):
        with autocast(a):
            loss = model(x, y)
        loss.backward()
        engine.step()
        return loss.item()
    try:
        return timed(a, step, data)
    finally:
        engine.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: --device cuda, and torch sees no GPU")
        return 77
    data = batches(a, a.steps + 2)
    tokens = a.batch * a.seq
    rows = {}
    for name, run in (("torch", lambda: run_torch(a, data)), ("zoe", lambda: run_zoe(a, data, False)),
                      ("zoe-waits", lambda: run_zoe(a, data, True))):
        seconds, losses = run()
        rows[name] = {"step_s": seconds, "tokens_per_s": tokens / seconds, "losses": losses}
        if a.device == "cuda":
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(f"GPT-2 shape L{a.layers} C{a.embd} T{a.seq} B{a.batch}, {a.device} ({gpu}), zoe stage {a.stage}, "
          f"{a.steps} timed steps")
    for name, r in rows.items():
        vs = "" if name == "torch" else f"  {r['tokens_per_s'] / rows['torch']['tokens_per_s']:.2f}x torch"
        print(f"  {name:10s} {r['tokens_per_s']:12.0f} tok/s  step {r['step_s'] * 1e3:8.1f} ms{vs}"
              f"  loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}")
    # The three train the same model from the same start on the same data: their first losses agree.
    first = [r["losses"][0] for r in rows.values()]
    ok = max(first) - min(first) <= 1e-2 * abs(first[0]) and all(r["losses"][-1] < r["losses"][0] for r in rows.values())
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "gpu": gpu, "stage": a.stage, "rows": rows,
                       "shape": {k: getattr(a, k) for k in ("layers", "embd", "heads", "seq", "batch", "vocab")}}, f)
    print("PASS" if ok else "FAIL: the rows' first losses differ or a loss did not fall")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

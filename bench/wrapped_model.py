#!/usr/bin/env python3
"""A model zoe trains through zoe.torch.wrap, for `zoe plan --model-work` (bench/plan_check.py
--wrapped): transformers' GPT-2 (dropout off) on random tokens, as a Trainer user would hand it.

  bench/wrapped_model.py describe --out work.json --micro-batches 1,2,4,8 [--layers 6 --embd 384 ...]
      measures it at stage 0 (zoe.torch.describe), one micro-step per micro-batch size
  bench/wrapped_model.py train --config job.json --set key=value... --report R.jsonl --steps 6
      trains it with that config (the `--set`s as `zoe train` takes them: dotted keys, JSON values)
      and writes a line per step: step_s, and the engine's ledger (zoe train --report's fields)
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
import zoe  # noqa: E402
import zoe.torch  # noqa: E402


def model_args(ap):
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)


class Gpt2(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        self.m = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.embd, n_layer=a.layers,
                                            n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def tokens(a, b, step):
    g = torch.Generator().manual_seed(step)
    idx = torch.randint(0, a.vocab, (b, a.seq + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


def apply_set(cfg, text):
    key, _, value = text.partition("=")
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = json.loads(value)


def describe(a):
    torch.manual_seed(0)
    if os.path.exists(a.out):
        os.remove(a.out)
    engine = zoe.Engine({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0},
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                         "zoe": {"device": "cpu", "device_memory_budget": "64GiB"}})
    model = zoe.torch.wrap(Gpt2(a), engine)
    for b in [int(x) for x in a.micro_batches.split(",")]:
        x, y = tokens(a, b, 0)
        e = zoe.torch.describe(model, lambda: model(x, y).backward(), a.out, micro_batch=b, tokens=b * a.seq)
        print(f"micro-batch {b}: {e['seconds']:.3f} s, {len(e['fetches'])} fetches", flush=True)
    engine.close()


def train(a):
    torch.manual_seed(0)
    cfg = json.load(open(a.config))
    for s in a.set:
        apply_set(cfg, s)
    engine = zoe.Engine(cfg)
    model = zoe.torch.wrap(Gpt2(a), engine)
    b = cfg.get("train_micro_batch_size_per_gpu", 1)
    acc = cfg.get("gradient_accumulation_steps", 1)
    with open(a.report, "w") as out:
        for step in range(a.steps):
            t0 = time.perf_counter()
            for m in range(acc):
                model(*tokens(a, b, step * acc + m)).backward()
            engine.step()
            st = engine.stats()
            led = st["ledger"]
            out.write(json.dumps({"step": step, "step_s": time.perf_counter() - t0,
                                  "ledger": [{"peak_device_bytes": led["device"]["peak"]}]}) + "\n")
    engine.close()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("describe")
    d.add_argument("--out", required=True)
    d.add_argument("--micro-batches", default="1,2,4,8")
    model_args(d)
    t = sub.add_parser("train")
    t.add_argument("--config", required=True)
    t.add_argument("--set", action="append", default=[])
    t.add_argument("--report", required=True)
    t.add_argument("--steps", type=int, default=6)
    model_args(t)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    describe(a) if a.what == "describe" else train(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

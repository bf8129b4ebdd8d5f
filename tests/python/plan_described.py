"""zoe.torch.describe and `zoe plan --model-work`: a wrapped model's units and micro-steps measured
in Python, planned by the CLI from them (not from the built-in GPT-2), and the plan's config
trained by zoe.Engine.

    python3 plan_described.py --zoe build/zoe --out DIR

The description must hold the engine's units exactly (their elements add up to the model's
parameters), each micro-step's fetches in order (every unit fetched in the forward and again in
the backward) with compute that adds up to the measured wall time, and zoe's own transient bytes; a second describe() at another
micro-batch joins the file. The plan must choose among the described micro-batches only, refuse a
device budget nothing fits with the smallest change, and write a config zoe.Engine trains with."""
import argparse
import json
import os
import subprocess
import sys

import torch

import zoe
import zoe.torch
from tiny_lm import TinyLM, batch

T, VOCAB = 16, 64


def plan(a, job, work, *extra):
    job_path = os.path.join(a.out, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    cmd = [a.zoe, "plan", "--config", job_path, "--model-work", work, "--out", os.path.join(a.out, "plan.json"),
           "--cache", os.path.join(a.out, "calibration.json"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoe", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = os.path.join(a.out, "work.json")
    if os.path.exists(work):
        os.remove(work)

    engine = zoe.Engine({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0},
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    model = zoe.torch.wrap(TinyLM(vocab=VOCAB, c=32, n_layer=2, t=T), engine)
    try:
        zoe.torch.describe(TinyLM(), lambda: None, work, micro_batch=1, tokens=1)
        raise AssertionError("describe() took a model that is not wrapped")
    except ValueError as e:
        assert "not wrapped" in str(e), e
    for b in (2, 4):
        x, y = batch(0, 0, vocab=VOCAB, b=b, t=T)
        entry = zoe.torch.describe(model, lambda: model(x, y).backward(), work, micro_batch=b, tokens=b * T)
        fetched = [f[0] for f in entry["fetches"]]
        forward = {f[0] for f in entry["fetches"] if not f[2]}
        backward = {f[0] for f in entry["fetches"] if f[2]}
        assert forward == backward == set(range(engine.num_units)), (forward, backward, engine.num_units)
        assert len(fetched) >= 2 * engine.num_units, fetched
        total = sum(f[1] for f in entry["fetches"])
        assert abs(total - entry["seconds"]) <= 1e-6 * max(1.0, entry["seconds"]), (total, entry["seconds"])
    doc = json.load(open(work))
    assert sum(doc["units"]) == engine.num_params, (doc["units"], engine.num_params)
    assert len(doc["units"]) == engine.num_units
    assert [s["micro_batch"] for s in doc["micro_steps"]] == [2, 4], doc["micro_steps"]
    # zoe's own peak beside its state counts: a unit's fp32 gradient staged at its hand-over
    assert all(s["activation_bytes"] >= 4 * max(doc["units"]) for s in doc["micro_steps"]), doc["micro_steps"]
    engine.close()

    # 8 sequences a step: the described micro-batches 2 and 4 (x4, x2) are the plan's only choices.
    job = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zoe": {"device": "cpu", "device_memory_budget": "64MiB"}}
    r = plan(a, job, work, "--json", "--top", "1000")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert out["plans"], out
    micro = {p["micro_batch"] for p in out["plans"]}
    assert micro <= {2, 4} and micro, micro
    assert all(p["micro_batch"] * p["accumulation"] == 8 for p in out["plans"])
    assert all(not p["activation_checkpointing"] for p in out["plans"])  # none was described
    best = out["plans"][0]
    cfg = json.load(open(os.path.join(a.out, "plan.json")))
    assert cfg["zero_optimization"]["stage"] == best["stage"], (cfg, best)

    # Human output names the description, not GPT-2.
    r = plan(a, job, work)
    assert r.returncode == 0 and "described by" in r.stdout, r.stdout + r.stderr

    # The plan's config trains the model (one step of 4 x 2).
    engine = zoe.Engine(cfg)
    model = zoe.torch.wrap(TinyLM(vocab=VOCAB, c=32, n_layer=2, t=T), engine)
    for m in range(best["accumulation"]):
        model(*batch(m, 0, vocab=VOCAB, b=best["micro_batch"], t=T)).backward()
    engine.step()
    engine.close()

    # A budget below any unit: refused up front with the smallest change, naming the budget.
    job["zoe"]["device_memory_budget"] = "4KiB"
    r = plan(a, job, work)
    assert r.returncode != 0 and "zoe.device_memory_budget" in r.stderr, (r.returncode, r.stdout, r.stderr)
    # A micro-batch the description lacks for this batch (3 sequences: neither 2 nor 4 divides it).
    job["zoe"]["device_memory_budget"] = "64MiB"
    job["train_micro_batch_size_per_gpu"], job["gradient_accumulation_steps"] = 3, 1
    r = plan(a, job, work)
    assert r.returncode != 0 and "micro-batch" in r.stderr, (r.returncode, r.stdout, r.stderr)
    # The config's GPT-2 shape is still read (a stage-3 fetch's cost is measured on it): a bad one is named.
    r = plan(a, job, work, "--set", "zoe.model.n_embd=64", "--set", "zoe.model.n_head=5")
    assert r.returncode == 2 and "zoe.model" in r.stderr, (r.returncode, r.stdout, r.stderr)
    # A file that is not a description.
    bad = os.path.join(a.out, "bad.json")
    with open(bad, "w") as f:
        json.dump({"format": "zoe model work 1", "units": [10, -1], "micro_steps": []}, f)
    job["train_micro_batch_size_per_gpu"], job["gradient_accumulation_steps"] = 4, 2
    r = plan(a, job, bad)
    assert r.returncode != 0 and "units[1]" in r.stderr, (r.returncode, r.stdout, r.stderr)
    print("plan_described: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

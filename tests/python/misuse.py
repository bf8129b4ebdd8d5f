"""Misuse through the Python package raises zoe.Error with a message naming the problem, and the
engine trains on afterwards; nothing crashes or hangs. Run alone or under mpirun (at 2+ ranks it
also hands a gradient over on rank 0 only)."""
import os
import sys
import tempfile
import threading
import time

import torch
from torch.utils import dlpack

import zoe
import zoe.torch
from expect import expect_raises

failures = []


def expect_error(fn, needle):
    expect_raises(failures, fn, zoe.Error, [needle])


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x, use_b):
        y = self.a(x)
        return (self.b(y) if use_b else y).square().sum()


def unused_on_some_ranks():
    """A module only rank 0 uses. Stages 0-2: the wrap hands zeros over for it elsewhere, and the
    step's norm is the plain average's. Stage 3 gathers at every fetch, so every rank must fetch
    the same units: an error on every rank instead (DeepSpeed's ZeRO-3 asks the same)."""
    for stage in (2, 3):
        try:
            unused_on_some_ranks_at(stage)
        except zoe.Error as x:
            if stage != 3 or "out of step" not in str(x):
                failures.append(f"a module unused on some ranks, stage {stage}: {x}")


def unused_on_some_ranks_at(stage):
    torch.manual_seed(0)
    ref = TwoHeads()
    torch.manual_seed(0)
    m = TwoHeads()
    e = zoe.Engine({"zero_optimization": {"stage": stage}})
    zoe.torch.wrap(m, e)
    if e.world_size == 1:
        e.close()
        return
    xs = [torch.randn(2, 4, generator=torch.Generator().manual_seed(r)) for r in range(e.world_size)]
    try:
        m(xs[e.rank], e.rank == 0).backward()
    except zoe.Error:
        e.close()
        raise
    if stage == 3:
        failures.append("stage 3 with different modules per rank did not fail")
    try:
        got = e.step(1e-3)["grad_norm"]
    except zoe.Error as x:
        failures.append(f"a module unused on some ranks: {x}")
        e.close()
        return
    (sum(ref(x, r == 0) for r, x in enumerate(xs)) / e.world_size).backward()
    want = torch.sqrt(sum(p.grad.square().sum() for p in ref.parameters())).item()
    if abs(got - want) > 1e-5 * want:
        failures.append(f"a module unused on some ranks: norm {got} vs {want}")
    e.close()


def close_waits_for_a_call():
    """close() from one thread while another is inside a call: it waits for that call, then later
    calls raise "closed" (it used to free the engine under the call). The call is a zoe_load of a
    checkpoint of a large unit, D seconds long when nothing else runs (the shorter of two loads);
    close() starts 2 ms into the load. (It was held on a FIFO manifest until zoe refused to read
    FIFOs.) Which thread's Python runs first after the call is the GIL's choice, so the check is
    on close(): had it not waited, it would return about 2 ms into the load; waiting, it returns
    when the load's call ends, at least D/2 in (or the load had ended before close() began)."""
    probe = zoe.Engine({"zero_optimization": {"stage": 0}})
    world = probe.world_size
    probe.close()
    if world > 1:  # zoe_load is collective: one rank's close would hold the others
        return
    e = zoe.Engine({"zero_optimization": {"stage": 0}})
    e.register_param("u", "u.w", [1 << 23], "float32", False)
    e.start()
    with tempfile.TemporaryDirectory() as d:
        e.save(d)
        durations = []
        for _ in range(2):
            t0 = time.monotonic()
            e.load(d)
            durations.append(time.monotonic() - t0)
        alone = min(durations)
        outcome = {}

        def load():
            outcome["load_start"] = time.monotonic()
            try:
                e.load(d)
                outcome["load"] = "ok"
            except zoe.Error as x:
                outcome["load"] = str(x)

        loader = threading.Thread(target=load, daemon=True)  # a stuck one must not hold the exit
        loader.start()
        while "load_start" not in outcome:
            time.sleep(0.0005)
        time.sleep(0.002)
        try:
            e.close()
            outcome["close"] = "ok"
        except zoe.Error as x:
            outcome["close"] = str(x)
        close_done = time.monotonic()
        loader.join(60)
    if "load" not in outcome:
        failures.append(f"close vs a call: the load is stuck: {outcome}")
        return
    if outcome["close"] != "ok" or outcome["load"] not in ("ok",) and "closed" not in outcome["load"]:
        failures.append(f"close vs a call: {outcome}")
    if outcome["load"] == "ok" and close_done - outcome["load_start"] < alone / 2:
        failures.append(f"close() returned {close_done - outcome['load_start']:.3f} s into a load of {alone:.3f} s: "
                        f"it did not wait for the call ({outcome})")
    expect_error(lambda: e.step(), "the engine is closed")
    expect_error(lambda: e.rank, "the engine is closed")
    e.close()  # again: a no-op


def close_raises_the_last_update_error():
    """Stage 3's update runs on after step() returns; when it fails, close() raises its error. It
    reads the optimizer state from NVMe: the swap files, cut to nothing, make that read fail. A
    first step writes that state (never written, it reads as zeros without a request); setting
    the weight then waits for its update and drops what it read ahead for the next one."""
    with tempfile.TemporaryDirectory() as d:
        e = zoe.Engine({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": d}}})
        if e.world_size > 1:
            e.close()
            return
        e.register_param("u", "u.w", [4], "float32", False)
        e.start()
        e.grads_ready(0, dlpack.to_dlpack(torch.ones(4)))
        e.step(1e-2)
        e.set_param("u.w", dlpack.to_dlpack(torch.full((4,), 0.5)))
        e.grads_ready(0, dlpack.to_dlpack(torch.ones(4)))
        swaps = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(".swap")]
        for f in swaps:
            os.truncate(f, 0)
        if not swaps:
            failures.append(f"no swap file under {d}")
        e.step(1e-2)
        expect_error(e.close, ".swap")
        expect_error(lambda: e.step(), "the engine is closed")


def main():
    expect_error(lambda: zoe.Engine({"zero_optimization": {"stag": 3}}), "stage")
    expect_error(lambda: zoe.Engine("{not json"), "config")
    e = zoe.Engine({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})
    expect_error(lambda: e.register_param("u", "u.x", [4], "int8", False), "weight dtypes")
    expect_error(lambda: e.fetch(0), "not started")
    e.register_param("u0", "u0.w", [4, 4], "float32", True)
    e.register_param("u1", "u1.b", [4], "float32", False)
    e.start()
    expect_error(lambda: e.fetch(99), "unit 99 does not exist")
    expect_error(lambda: e.release(0), "not fetched")
    expect_error(lambda: e.step(), "before any gradient")
    expect_error(lambda: e.grad_param("u0.w", dlpack.to_dlpack(torch.ones(3))), "shape [3], expected [4, 4]")
    expect_error(lambda: e.grad_param("u0.w", dlpack.to_dlpack(torch.ones(4, 4, dtype=torch.int32))), "int32")
    expect_error(lambda: e.grad_param("nope", dlpack.to_dlpack(torch.ones(4, 4))), "no parameter named 'nope'")
    expect_error(lambda: e.grad_param("u0.w", torch.ones(4, 4)), "DLPack capsule")
    expect_error(lambda: e.grads_ready(1, None), "no gradient is staged")
    # A gradient on rank 0 only: an error at step on every rank, and the gradients dropped.
    if e.world_size > 1:
        if e.rank == 0:
            e.grads_ready(0, dlpack.to_dlpack(torch.ones(16)))
        expect_error(lambda: e.step(1e-2), "rank 0 handed over a gradient of unit 'u0'")
    e.grad_param("u0.w", dlpack.to_dlpack(torch.ones(4, 4).t()))  # strided
    e.grads_ready(1, dlpack.to_dlpack(torch.full((4,), 2.0, dtype=torch.float64)))
    r = e.step(1e-2)
    if not r["applied"] or r["step"] != 1:
        failures.append(f"step after the misuse: {r}")
    w = dlpack.from_dlpack(e.fetch(0)).clone()
    e.release(0)
    if not torch.allclose(w, torch.full((16,), -0.01), atol=1e-6):
        failures.append(f"u0.w after one step: {w.tolist()}")
    e.close()
    expect_error(lambda: e.step(), "closed")
    # wrap: a parameter zoe cannot hold
    m = torch.nn.Linear(2, 2).to(torch.float64)
    e2 = zoe.Engine({"zero_optimization": {"stage": 0}})
    try:
        zoe.torch.wrap(m, e2)
        failures.append("wrap of a float64 module did not fail")
    except TypeError as x:
        if "float64" not in str(x):
            failures.append(f"wrap message: {x}")
    e2.close()
    unused_on_some_ranks()
    close_waits_for_a_call()
    close_raises_the_last_update_error()
    for f in failures:
        print("FAIL:", f)
    print(f"{'PASS' if not failures else 'FAIL'}: Python misuse checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

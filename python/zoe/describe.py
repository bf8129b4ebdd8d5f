"""zoe.torch.describe: a wrapped model's units and one measured micro-step, written for
`zoe plan --model-work FILE`, which plans the job from them instead of the built-in GPT-2.

    engine = zoe.Engine({"zero_optimization": {"stage": 0}, ...})   # resident: compute alone
    model = zoe.torch.wrap(build_model(), engine)
    zoe.torch.describe(model, lambda: model(x, y).backward(), "work.json", micro_batch=4, tokens=4 * 128)
    $ zoe plan --config job.json --model-work work.json

The plan needs what GPT-2's calibration measures for itself: each unit's elements, the order of
the micro-step's fetches (forward, then backward) and the compute that follows each fetch until
the next. describe() runs micro_step() (one forward and backward, the caller's code) `warm` times,
then `repeats` times timed, keeps the median run (torch's own micro-steps vary by 10 % and more
here), and splits its wall time at each fetch: the time
from one fetch to the next belongs to the unit fetched first, so the caller's own work between
modules (the loss, data moved to the device) counts too, as zoe plan adds it up. On a GPU every
fetch waits for the device first (torch.cuda.synchronize), so a segment holds its kernels. The
activations' bytes are the engine's peak beside its state: its own transient memory (a unit's
gradient staged at its hand-over) and, on a GPU, what torch's allocator took since wrap found the
GPU, at each fetch, which zoe.torch.wrap books in zoe's ledger (zoe.device_memory_budget covers
both); torch's own peak less what it held before, where that is higher. On the CPU device torch's
activations live outside zoe's budgets.

Each call adds (or replaces) the micro-step of its micro_batch in the file: call it once per
micro-batch size the plan may choose from. A file that describes other units (another model) is
replaced. Measure on an engine of its own at stage 0 with
nothing offloaded: the micro-steps' gradients accumulate in it (it is not stepped), and at other
stages the segments would hold zoe's loads, which zoe plan predicts itself.
"""
import json
import os
import time

import torch

FORMAT = "zoe model work 1"


def _on_gpu(model):
    return any(u.params and u.params[0].param.device.type == "cuda" for u in model._zoe.units)


def _timed(model, micro_step, gpu):
    """One micro-step: its wall time and its fetches as (unit, seconds from the start, backward)."""
    w = model._zoe
    marks = []
    t0 = time.perf_counter()

    def mark(u, backward):
        if gpu:
            torch.cuda.synchronize()
        marks.append((u, time.perf_counter() - t0, bool(backward)))

    w.fetch_trace = mark
    try:
        micro_step()
        if gpu:
            torch.cuda.synchronize()
    finally:
        w.fetch_trace = None
    return time.perf_counter() - t0, marks


def _fetches(wall, marks):
    """Each fetch with the compute that follows it up to the next (the first also takes what came
    before it; the last, the rest of the micro-step)."""
    out = []
    for i, (u, t, backward) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else wall
        start = 0.0 if i == 0 else t
        out.append([u, max(0.0, end - start), backward])
    return out


def describe(model, micro_step, path, *, micro_batch, tokens, checkpointing=False, repeats=5, warm=2):
    """Measures micro_step() of `model` (wrapped by zoe.torch.wrap) and writes its description to
    `path` for `zoe plan --model-work`. micro_batch: the sequences one micro-step takes (the plan
    chooses among the sizes described); tokens: the tokens it takes (the plan's tokens/s);
    checkpointing: whether micro_step recomputes activations (torch.utils.checkpoint), so the plan
    may weigh both. Returns the micro-step's entry. Raises ValueError for a model that is not
    wrapped, a micro-step that fetches nothing, or one whose fetches differ between runs (the
    plan needs one order)."""
    w = getattr(model, "_zoe", None)
    if w is None:
        raise ValueError("zoe.torch.describe: the model is not wrapped (zoe.torch.wrap(model, engine) first)")
    if int(micro_batch) < 1 or int(tokens) < 1 or int(repeats) < 1:
        raise ValueError(f"zoe.torch.describe: micro_batch {micro_batch}, tokens {tokens} and repeats {repeats} "
                         "must be at least 1")
    gpu = _on_gpu(model)
    for _ in range(int(warm)):  # allocations, first-touch pages, kernels' plans, torch's caches
        micro_step()
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    runs = []
    for _ in range(int(repeats)):
        wall, marks = _timed(model, micro_step, gpu)
        if not marks:
            raise ValueError("zoe.torch.describe: micro_step() fetched no unit (it must run the wrapped model's "
                             "forward and backward)")
        if runs and [m[0] for m in marks] != [m[0] for m in runs[0][1]]:
            raise ValueError("zoe.torch.describe: micro_step() fetched the units in a different order on two runs; "
                             "zoe plan needs the micro-step's one order")
        runs.append((wall, marks))
    best = sorted(runs, key=lambda r: r[0])[len(runs) // 2]  # the median run: torch's own steps vary
    # Beside zoe's state, as the engine's ledger peaked: what zoe held for a moment and, on a GPU,
    # what torch's allocator held at the fetches (booked by the wrapper).
    device = w.engine.stats()["ledger"]["device"]
    activations = max(0, device["peak"] - device["persistent"])
    if gpu:
        activations = max(activations, torch.cuda.max_memory_reserved(w.gpu) - w.torch_base)
    entry = {"micro_batch": int(micro_batch), "checkpointing": bool(checkpointing), "tokens": int(tokens),
             "activation_bytes": int(max(0, activations)), "seconds": best[0], "fetches": _fetches(*best)}
    units = [max(ps.offset + ps.numel for ps in u.params) for u in w.units]
    doc = {"format": FORMAT, "units": units, "unit_names": [u.params[0].name for u in w.units], "micro_steps": []}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("format") == FORMAT and old.get("units") == units:
            doc["micro_steps"] = [s for s in old.get("micro_steps", [])
                                  if (s.get("micro_batch"), s.get("checkpointing")) != (entry["micro_batch"],
                                                                                        entry["checkpointing"])]
    doc["micro_steps"].append(entry)
    doc["micro_steps"].sort(key=lambda s: (s["micro_batch"], s["checkpointing"]))
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return entry

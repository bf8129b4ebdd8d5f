"""Misuse of zoe.Engine.step and of a model under zoe.torch.wrap that used to be accepted silently,
with wrong weights as the outcome, raises naming the problem: a step while units are held, a
learning rate that is not one, a parameter added, frozen or converted after wrap, a parameter
shared with another wrapped model; and state_dict() of a wrapped model holds the full weights.
Run alone or under mpirun (at 2+ ranks a unit held on rank 0 only: its step is refused there, and
every rank steps once when it retries)."""
import inspect
import io
import json
import math
import os
import struct
import sys
import tempfile

import torch

import zoe
import zoe.torch
from expect import expect_raises

failures = []


def expect(fn, error, needles):
    expect_raises(failures, fn, error, needles)


class Tied(torch.nn.Module):
    """An embedding and a head sharing its weight, a layer between."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.mid = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.emb(ids)))).square().mean()


def wrapped(model_fn=Tied, stage=3):
    torch.manual_seed(0)
    model = model_fn()
    engine = zoe.Engine({"zero_optimization": {"stage": stage},
                         "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})
    return zoe.torch.wrap(model, engine), engine


IDS = torch.tensor([[1, 2, 3, 5]])


def full_values(model):
    with zoe.torch.gathered(model):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def step_while_held():
    """Inside gathered() (and between fetch and release) a step is refused, naming the held units;
    the weights stay, and the step goes through once they are released."""
    model, engine = wrapped()
    model(IDS).backward()
    before = full_values(model)
    with zoe.torch.gathered(model):
        expect(engine.step, zoe.Error, ["2 units are still held (fetched and not released): 0 ('emb'), "
                                        "1 ('mid'); release them before stepping"])
    if full_values(model)["mid.weight"].ne(before["mid.weight"]).any():
        failures.append("a refused step changed the weights")
    engine.fetch(1)
    expect(engine.step, zoe.Error, ["unit 1 ('mid') is still held", "release it before stepping"])
    engine.release(1)
    engine.step()
    if full_values(model)["mid.weight"].eq(before["mid.weight"]).all():
        failures.append("the step after the release did not update the weights")
    engine.close()


def held_on_one_rank():
    """Stage 0 fetches are local: a unit held on rank 0 only fails rank 0's step before its first
    collective; the other ranks wait in theirs until rank 0, the unit released, steps again, and
    every rank has stepped once."""
    model, engine = wrapped(stage=0)
    if engine.world_size == 1:
        engine.close()
        return
    model(IDS).backward()
    if engine.rank == 0:
        engine.fetch(1)
        expect(engine.step, zoe.Error, ["unit 1 ('mid') is still held"])
        engine.release(1)
    r = engine.step()
    if r["step"] != 1:
        failures.append(f"rank {engine.rank}: the step after rank 0's refusal: {r}")
    engine.close()


def learning_rates():
    """NaN, inf and 1e300 are refused as the config file refuses them; a negative lr is no longer
    the config's value in disguise (None is)."""
    model, engine = wrapped()
    model(IDS).backward()
    for lr, shown in ((math.nan, "lr nan"), (math.inf, "lr inf"), (1e300, "lr 1e+300")):
        expect(lambda: engine.step(lr), zoe.Error, [shown, "is not a learning rate", "optimizer.params.lr"])
    expect(lambda: engine.step(-0.5), zoe.Error, ["lr -0.5 is not a learning rate", "lr=None"])
    r = engine.step(None)
    if r["lr"] != 0.01 or r["step"] != 1:
        failures.append(f"the step after refused lrs: {r}")
    if not all(torch.isfinite(v).all() for v in full_values(model).values()):
        failures.append("weights are not finite after refused lrs")
    engine.close()


def state_dict_is_full():
    """state_dict() outside gathered() holds full host copies (tied weights one tensor): torch.save
    of it loads into a plain model; inside gathered() too; keep_vars=True outside it raises."""
    torch.manual_seed(0)
    want = Tied().state_dict()
    model, engine = wrapped()
    sd = model.state_dict()
    for k, v in want.items():
        if k not in sd or sd[k].shape != v.shape or not torch.equal(sd[k], v):
            failures.append(f"state_dict()['{k}']: {tuple(sd[k].shape) if k in sd else 'missing'} vs {tuple(v.shape)}")
    if sd["emb.weight"] is not sd["head.weight"]:
        failures.append("tied weights are two tensors in state_dict()")
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    plain = Tied()
    plain.load_state_dict(torch.load(buf))
    if not torch.equal(plain.mid.weight, want["mid.weight"]):
        failures.append("torch.save(model.state_dict()) does not load back")
    parent = torch.nn.ModuleDict({"inner": model})  # a wrapped model inside an unwrapped one
    if parent.state_dict()["inner.mid.weight"].shape != want["mid.weight"].shape:
        failures.append("a parent's state_dict() holds the wrapped child's empty parameters")
    with zoe.torch.gathered(model):
        inside = model.state_dict()
        if not torch.equal(inside["mid.bias"], want["mid.bias"]):
            failures.append("state_dict() inside gathered()")
        if model.state_dict(keep_vars=True)["mid.weight"] is not model.mid.weight:
            failures.append("state_dict(keep_vars=True) inside gathered() is not the parameters")
    expect(lambda: model.state_dict(keep_vars=True), RuntimeError, ["keep_vars=True", "zoe.torch.gathered"])
    if any(u.refs for u in model._zoe.units):
        failures.append("state_dict() left units fetched")
    model(IDS).backward()
    engine.step()
    if torch.equal(model.state_dict()["mid.weight"], want["mid.weight"]):
        failures.append("state_dict() after a step holds the weights of before it")
    engine.close()


def added_after_wrap():
    """A module added after wrap: the next forward raises naming its parameter; one added between
    the backward and the step: the step. Removed again, training goes on."""
    model, engine = wrapped()
    model.extra = torch.nn.Linear(4, 4)
    expect(lambda: model(IDS), RuntimeError, ["parameter 'extra.weight' was added after zoe.torch.wrap"])
    del model.extra
    model(IDS).backward()
    model.mid.extra = torch.nn.Parameter(torch.ones(4))
    expect(engine.step, RuntimeError, ["parameter 'mid.extra' was added after zoe.torch.wrap"])
    del model.mid.extra
    engine.step()
    engine.close()


def frozen_after_wrap():
    """requires_grad_(False) after wrap would still be stepped: the next forward (or step) raises;
    a parameter frozen at wrap and unfrozen later would never be."""
    torch.manual_seed(0)
    model = Tied()
    model.mid.bias.requires_grad_(False)
    engine = zoe.Engine({"zero_optimization": {"stage": 3}})
    zoe.torch.wrap(model, engine)
    model.mid.weight.requires_grad_(False)
    expect(lambda: model(IDS), RuntimeError, ["parameter 'mid.weight' was set requires_grad=False after"])
    model.mid.weight.requires_grad_(True)
    model(IDS).backward()
    model.mid.weight.requires_grad_(False)
    expect(engine.step, RuntimeError, ["parameter 'mid.weight' was set requires_grad=False"])
    model.mid.weight.requires_grad_(True)
    model.mid.bias.requires_grad_(True)
    expect(engine.step, RuntimeError, ["parameter 'mid.bias' had requires_grad=False at zoe.torch.wrap"])
    model.mid.bias.requires_grad_(False)
    engine.step()
    engine.close()


def converted_after_wrap():
    """model.double() (or .half(), .to(dtype)) after wrap: zoe trains the weights in the dtype of
    wrap; the next forward raises naming the parameter and both dtypes."""
    for convert, name in ((lambda m: m.double(), "torch.float64"), (lambda m: m.half(), "torch.float16"),
                          (lambda m: m.to(torch.bfloat16), "torch.bfloat16")):
        model, engine = wrapped()
        convert(model)
        expect(lambda: model(IDS), RuntimeError, ["parameter 'emb.weight' is " + name,
                                                  "was torch.float32 at zoe.torch.wrap"])
        engine.close()


def shared_with_another_wrapped_model():
    """A parameter of a model wrapped already cannot be wrapped again under another engine (it used
    to fail with "shape [0] has a dimension <= 0")."""
    first, engine = wrapped()
    second = torch.nn.Sequential(torch.nn.Linear(4, 4), first.mid)
    other = zoe.Engine({"zero_optimization": {"stage": 3}})
    expect(lambda: zoe.torch.wrap(second, other), ValueError,
           ["parameter '1.weight' is already under a zoe engine", "one wrapped model only"])
    expect(lambda: zoe.torch.wrap(first, other), ValueError, ["parameter 'emb.weight' is already under"])
    other.close()
    engine.close()


def forward_keeps_its_signature():
    """transformers' Trainer reads the forward's signature to choose the dataset columns it keeps;
    wrap's (*args, **kwargs) made it drop input_ids (issue 45). Exports carry {"format": "pt"}."""
    model, engine = wrapped()
    params = list(inspect.signature(model.forward).parameters)
    if params != ["ids"]:
        failures.append(f"the wrapped forward's parameters are {params}, not ['ids']")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "w.safetensors")
        engine.export(path)  # collective: rank 0 writes (its own temporary path)
        if engine.rank == 0:
            with open(path, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            if header.get("__metadata__", {}).get("format") != "pt":
                failures.append(f"export's metadata is {header.get('__metadata__')}, not {{'format': 'pt'}}")
    engine.close()


def main():
    for test in (step_while_held, held_on_one_rank, learning_rates, state_dict_is_full, added_after_wrap,
                 frozen_after_wrap, converted_after_wrap, shared_with_another_wrapped_model,
                 forward_keeps_its_signature):
        before = len(failures)
        try:
            test()
        except Exception as e:  # noqa: BLE001
            failures.append(f"{type(e).__name__}: {e}")
        for f in failures[before:]:
            print(f"FAIL: {test.__name__}: {f}")
    print(f"{'PASS' if not failures else 'FAIL'}: misuse of wrap and step raises")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

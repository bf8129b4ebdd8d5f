"""zoe.torch.wrap places the module where zoe's memory is (zoe_device): on a GPU engine the
parameters' empties, the module's buffers (a causal mask, rotary frequencies) and its frozen
parameters (a LoRA's base weights: read by a forward beside the trained ones) go to that GPU, as
DeepSpeed's engine moves the module, so a framework that left the model on the CPU (the Trainer
leaves placement to zoe) meets no device mismatch. Here: their placement onto another device
(meta, standing in for a GPU: a CPU-only torch has no CUDA tensors; meta's storage cannot be
swapped into a CPU parameter, so there a frozen parameter is replaced by a frozen one, where CPU
to a GPU keeps the object as Module.to does; torch_parity.py --device cuda wraps a CPU model with
a frozen parameter on a GPU engine on a lease); the CPU engine's (kDLCPU, 0) moving nothing;
zoe_device before zoe_start an error; a parameter already on another device than zoe's refused,
naming both."""
import sys

import torch

import zoe
import zoe.torch


class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones(4))
        self.register_buffer("absent", None)
        self.inner = torch.nn.Module()
        self.inner.register_buffer("freq", torch.arange(4.0), persistent=False)
        self.frozen = torch.nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return (self.frozen(self.lin(x) * self.mask) + self.inner.freq).square().mean()


def trains_a_step(device, failures):
    """A CPU model with a frozen layer, wrapped on a `device` engine, trains a step: the frozen
    parameter is the same object, where zoe's memory is, unchanged; the trained weight moved."""
    e = zoe.Engine({"zero_optimization": {"stage": 3}, "zoe": {"device": device}})
    m = WithBuffers()
    frozen, trained = m.frozen.weight, m.lin.weight.detach().clone()
    before = frozen.detach().clone()
    zoe.torch.wrap(m, e)
    where = zoe.torch._engine_device(e)
    m(torch.ones(2, 4, device=where)).backward()
    res = e.step()
    if not res["applied"]:
        failures.append(f"{device}: the step was not applied: {res}")
    if m.frozen.weight is not frozen or frozen.device != where or frozen.requires_grad:
        failures.append(f"{device}: the frozen parameter was replaced or left on {frozen.device} (zoe's: {where})")
    elif not torch.equal(frozen.cpu(), before):
        failures.append(f"{device}: the frozen parameter changed")
    with zoe.torch.gathered(m):
        if torch.equal(m.lin.weight.detach().cpu(), trained):
            failures.append(f"{device}: the trained weight did not move")
    e.close()
    print(f"{device}: a step with a frozen layer: frozen on {frozen.device}, zoe's memory on {where}")


def main():
    failures = []
    e = zoe.Engine({"zero_optimization": {"stage": 3}})
    try:
        e.device()
        failures.append("zoe_device before zoe_start did not raise")
    except zoe.Error as err:
        print(f"zoe_device before zoe_start: {err}")
    m = WithBuffers()
    zoe.torch.wrap(m, e)
    if e.device() != (1, 0):
        failures.append(f"the CPU engine's device is {e.device()}")
    if m.mask.device.type != "cpu" or m.lin.weight.device.type != "cpu":
        failures.append("a CPU engine moved the module")
    e.close()

    m = WithBuffers()
    zoe.torch._place_unowned(m, torch.device("meta"))
    placed = {"mask": m.mask.device.type, "inner.freq": m.inner.freq.device.type,
              "frozen.weight": m.frozen.weight.device.type, "frozen.bias": m.frozen.bias.device.type}
    if set(placed.values()) != {"meta"} or m.absent is not None or m.lin.weight.device.type != "cpu":
        failures.append(f"the buffers and frozen parameters were not placed (or more was moved): {placed}, "
                        f"the trained weight on {m.lin.weight.device}")
    if not isinstance(m.frozen.weight, torch.nn.Parameter) or m.frozen.weight.requires_grad:
        failures.append("a frozen parameter placed is no longer a frozen Parameter")
    print(f"buffers and frozen parameters placed on the stand-in device: {placed}")

    e = zoe.Engine({"zero_optimization": {"stage": 3}})
    try:
        zoe.torch.wrap(WithBuffers().to("meta"), e)  # parameters on another device than zoe's CPU
        failures.append("wrap took parameters on another device than zoe's")
    except ValueError as err:
        if "lin.weight is on meta but zoe's memory is on cpu" not in str(err):
            failures.append(f"wrap's message '{err}' does not name the parameter and both devices")
        print(f"parameters elsewhere: {err}")
    e.close()
    trains_a_step("cpu", failures)
    if torch.cuda.is_available():  # on a lease: tools/gpu-followup.sh's python step
        trains_a_step("cuda", failures)
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

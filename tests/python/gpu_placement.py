"""zoe.torch.wrap places the module where zoe's memory is (zoe_device): on a GPU engine the
parameters' empties and the module's buffers (a causal mask, rotary frequencies: what a forward
reads beside the weights) go to that GPU, as DeepSpeed's engine moves the module, so a framework
that left the model on the CPU (the Trainer leaves placement to zoe) meets no device mismatch.
Here: the buffers' placement onto another device (meta, standing in for a GPU: a CPU-only torch
has no CUDA tensors; torch_parity.py --device cuda wraps a CPU model on a GPU engine on a lease);
the CPU engine's (kDLCPU, 0) moving nothing; zoe_device before zoe_start an error; a parameter
already on another device than zoe's refused, naming both."""
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
    zoe.torch._place_buffers(m, torch.device("meta"))
    placed = {"mask": m.mask.device.type, "inner.freq": m.inner.freq.device.type}
    if set(placed.values()) != {"meta"} or m.absent is not None or m.lin.weight.device.type != "cpu":
        failures.append(f"the buffers were not placed (or more was moved): {placed}, weight on {m.lin.weight.device}")
    print(f"buffers placed on the stand-in device: {placed}")

    e = zoe.Engine({"zero_optimization": {"stage": 3}})
    try:
        zoe.torch.wrap(WithBuffers().to("meta"), e)  # parameters on another device than zoe's CPU
        failures.append("wrap took parameters on another device than zoe's")
    except ValueError as err:
        if "lin.weight is on meta but zoe's memory is on cpu" not in str(err):
            failures.append(f"wrap's message '{err}' does not name the parameter and both devices")
        print(f"parameters elsewhere: {err}")
    e.close()
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

"""Engine.export holds one unit at a time on rank 0, not the model; under mpirun.

    mpirun -np 2 python3 export_rss.py [--units 16] [--unit-mib 8]

A stage-3 model of --units units of --unit-mib MiB each (fp32), just made (no step has touched a
gather buffer yet: the worst case), is exported; rank 0's peak RSS during the export (VmHWM, reset
just before through /proc/self/clear_refs) may grow by at most the unit being written, twice (its
gathered buffer, host memory on the CPU device and device memory on a GPU, and its fp32 copy for
the file), plus 16 MiB (the writer's buffers, the allocator's slack). The model is --units times a
unit: a consolidation that held it would exceed the bound several times over. (After training the
growth measured 0: the buffers exist already.)"""
import argparse
import os
import sys

import torch

import zoe
import zoe.torch

FIXED_MIB = 16


def vm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # MiB
    raise RuntimeError(field)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=16)
    ap.add_argument("--unit-mib", type=int, default=8)
    ap.add_argument("--out", default="/tmp")
    a = ap.parse_args()
    side = int((a.unit_mib * 2**20 / 4) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(a.units)])
    engine = zoe.Engine({"zero_optimization": {"stage": 3}})
    zoe.torch.wrap(model, engine)
    unit_mib = side * side * 4 / 2**20
    path = os.path.join(a.out, f"zoe_export_rss_{os.getppid()}.safetensors")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = vm("VmRSS")
    engine.export(path)
    growth = vm("VmHWM") - before
    ok = True
    if engine.rank == 0:
        size = os.path.getsize(path) / 2**20
        os.unlink(path)
        ok = growth <= 2 * unit_mib + FIXED_MIB and size >= a.units * unit_mib
        print(f"{'PASS' if ok else 'FAIL'}: rank 0 grew {growth:.1f} MiB exporting a {size:.0f} MiB model of "
              f"{a.units} units of {unit_mib:.1f} MiB (bound: 2 x unit + {FIXED_MIB} MiB = {2 * unit_mib + FIXED_MIB:.1f})",
              flush=True)
    engine.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

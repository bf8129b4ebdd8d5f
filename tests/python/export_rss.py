"""Engine.export holds one unit at a time on rank 0, not the model; under mpirun.

    mpirun -np 2 python3 export_rss.py [--units 16] [--unit-mib 8] [--writer engine|hf]

A stage-3 model of --units units of --unit-mib MiB each (fp32), after a step, is exported;
rank 0's peak RSS during the export (VmHWM, reset just before through /proc/self/clear_refs) may
grow by at most one unit (a copy of the unit being written) plus 16 MiB (the writer's buffers, the
allocator's slack). The model is --units times a unit: a consolidation that held it on rank 0
would exceed the bound several times over."""
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
    ap.add_argument("--writer", choices=["engine", "hf"], default="engine",
                    help="Engine.export (one file), or zoe.integrations.hf.save_pretrained_weights (shards)")
    a = ap.parse_args()
    side = int((a.unit_mib * 2**20 / 4) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(a.units)])
    engine = zoe.Engine({"zero_optimization": {"stage": 3}})
    zoe.torch.wrap(model, engine)
    unit_mib = side * side * 4 / 2**20
    # As after training: a step done (its update, which makes the Adam moments' pages, finished)
    # and the gather buffers in use, so that only what the export itself adds is counted.
    model(torch.randn(4, side)).square().mean().backward()
    engine.step(lr=1e-3)
    with zoe.torch.gathered(model):
        pass
    path = os.path.join(a.out, f"zoe_export_rss_{os.getppid()}.safetensors")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = vm("VmRSS")
    if a.writer == "engine":
        engine.export(path)
    else:  # shards of 3 units and an index: ZoeTrainer.save_model's writer
        import shutil
        import zoe.integrations.hf as hf
        files = hf.save_pretrained_weights(model, path, max_shard_bytes=int(3 * unit_mib * 2**20),
                                           writer=engine.rank == 0)
    growth = vm("VmHWM") - before
    ok = True
    if engine.rank == 0:
        if a.writer == "engine":
            size = os.path.getsize(path) / 2**20
            os.unlink(path)
        else:
            size = sum(os.path.getsize(f) for f in files if f.endswith(".safetensors")) / 2**20
            shutil.rmtree(path)
        ok = growth <= unit_mib + FIXED_MIB and size >= a.units * unit_mib
        print(f"{'PASS' if ok else 'FAIL'}: {a.writer} writer: rank 0 grew {growth:.1f} MiB exporting a {size:.0f} MiB model of "
              f"{a.units} units of {unit_mib:.1f} MiB (bound: one unit + {FIXED_MIB} MiB = {unit_mib + FIXED_MIB:.1f})",
              flush=True)
    engine.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

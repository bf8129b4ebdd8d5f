"""zoe.torch.wrap against plain PyTorch: the same model, data and AdamW; run under mpirun.

    mpirun -np 2 python3 torch_parity.py --stage 3 [--nvme DIR]

Every rank trains the wrapped model on its own batches; beside it, a plain PyTorch copy trains on
every rank's batches together (the mean of the rank losses, which is what zoe's averaged gradient
is). Each step's loss on this rank's batch must agree to 1e-5 relative. The wrapped model holds
no parameter memory of its own between steps, and zoe's ledger holds the parameters: all of them
at stage 0, a 1/N share at stage 3 (on NVMe with --nvme)."""
import argparse
import copy
import os
import sys

import torch

import zoe
import zoe.torch
from tiny_lm import HfGpt2, TinyLM, adamw, batch

LR, WD, STEPS = 1e-2, 0.01, 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--nvme")
    ap.add_argument("--model", choices=["tiny", "hf-gpt2"], default="tiny")
    a = ap.parse_args()
    if a.model == "hf-gpt2":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("SKIP: transformers is not installed (tools/install-deps.sh installs it)")
            return 77
    if a.nvme:
        os.makedirs(a.nvme, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # No prefetch and no keeping: a released unit's buffer goes straight to the next unit of its
    # size, so a saved tensor still pointing into it would see another block's weights.
    zo = {"stage": a.stage, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}
    if a.nvme:
        zo["offload_optimizer"] = {"device": "nvme", "nvme_path": a.nvme}
        if a.stage == 3:
            zo["offload_param"] = {"device": "nvme", "nvme_path": a.nvme}
    cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": zo,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}}}
    if os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0":
        torch.manual_seed(12345)  # other ranks build different initial values: rank 0's count
    make = TinyLM if a.model == "tiny" else HfGpt2
    model = make()
    torch.manual_seed(0)
    ref = make()  # rank 0's initial values, on every rank
    opt = adamw(ref, LR, WD)
    engine = zoe.Engine(cfg)
    rank, world = engine.rank, engine.world_size
    zoe.torch.wrap(model, engine)
    n_params = sum(p.numel() for p in ref.parameters())
    assert engine.num_params == n_params, (engine.num_params, n_params)
    worst = 0.0
    for step in range(STEPS):
        idx, tgt = batch(step, rank)
        loss = model(idx, tgt)
        loss.backward()
        res = engine.step()
        assert res["applied"] and res["step"] == step + 1, res
        # the reference: all ranks' batches, mean of their losses
        opt.zero_grad()
        losses = [ref(*batch(step, r)) for r in range(world)]
        (sum(losses) / world).backward()
        opt.step()
        want = losses[rank].item()
        rel = abs(loss.item() - want) / abs(want)
        worst = max(worst, rel)
        if rank == 0:
            print(f"step {step} loss {loss.item():.7f} reference {want:.7f} rel {rel:.1e}", flush=True)
    held = sum(p.numel() for p in model.parameters())
    st = engine.stats()
    led = st["ledger"]
    tier = "nvme" if (a.nvme and a.stage == 3) else "device"
    param_bytes = led[tier]["param"]
    full = 4 * n_params
    # Linear and LayerNorm save their weights for backward: as descriptors, never as the memory
    ok = worst <= 1e-5 and held == 0 and model._zoe.saved_views >= 2 * STEPS * len(model.blocks)
    if a.stage < 3:
        ok &= param_bytes == full
    else:  # a 1/N share, up to the padding of each unit to N chunks
        ok &= full / world <= param_bytes <= full / world + 4 * world * engine.num_units
    print(f"rank {rank}: worst rel {worst:.1e}, torch holds {held} parameter elements, {model._zoe.saved_views} saved views, ledger {tier} param "
          f"{param_bytes} B of {full} B", flush=True)
    engine.close()
    if rank == 0:
        print(f"{'PASS' if ok else 'FAIL'}: zoe.torch.wrap vs torch AdamW, {a.model}, stage {a.stage}, {world} ranks"
              f"{', nvme' if a.nvme else ''}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

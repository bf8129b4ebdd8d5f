"""zoe.integrations.accelerate.prepare in a raw Accelerate loop against the same loop running
plain torch AdamW in one process on the same global batch; under mpirun.

    mpirun -np 2 python3 accelerate_loop.py --stage 3 [--accum 2]

The loop is Accelerate's documented one (accumulate(), backward(), the prepared optimizer and
scheduler stepping every micro-batch). Rank 0 first runs the reference in a child process (one
process, batches of 2B, torch AdamW with decay on 2-D weights, accelerator.clip_grad_norm_ at 1.0,
transformers' linear warmup and decay); zoe's run counts its scheduler as Accelerate does
(num_processes steps per optimizer step). Checked: each step's loss within 1e-5 relative, zoe's
grad norm within 1e-5 of the clipped norm, the final weights within 1e-5, and
accelerator.save_state at step 5 then load_state in a fresh run giving steps 6-10 bit for bit;
an fp16 Accelerator refused by prepare(), named."""
import argparse
import json
import os
import shutil
import sys
import tempfile
import types

import torch

import framework_common

STEPS, B, LR, WD, CLIP, WARMUP = 10, 2, 5e-3, 0.1, 1.0, 3
failures = []


tiny_gpt2 = framework_common.tiny_gpt2


def loader(n, batch):
    return torch.utils.data.DataLoader(framework_common.dataset(n), batch_size=batch, shuffle=False)


def train(accelerator, model, opt, sched, data, accum, steps_done=0, save_at=None, save_dir=None, clip=None):
    """Accelerate's loop; returns each step's loss (the micro-batch losses' mean) and grad norm."""
    losses, norms, micro = [], [], []
    for batch in data:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            micro.append(loss.item())
            accelerator.backward(loss)
            if clip is not None and accelerator.sync_gradients:
                norms.append(accelerator.clip_grad_norm_(model.parameters(), clip).item())
            opt.step()
            sched.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            if clip is None:
                norms.append(opt.optimizer.grad_norm)
            losses.append(sum(micro) / len(micro))
            micro = []
            if steps_done + len(losses) == save_at:
                accelerator.save_state(save_dir)
    return losses, norms


def reference(a):
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup
    accelerator = Accelerator(gradient_accumulation_steps=a.accum)
    model = tiny_gpt2()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=LR)
    sched = get_linear_schedule_with_warmup(opt, WARMUP, STEPS)
    model, opt, data, sched = accelerator.prepare(model, opt, loader(B * a.world * a.accum * STEPS, B * a.world), sched)
    losses, norms = train(accelerator, model, opt, sched, data, a.accum, clip=CLIP)
    with open(a.reference, "w") as f:
        json.dump({"losses": losses, "norms": norms,
                   "weights": {k: v.tolist() for k, v in model.state_dict().items()}}, f)


def zoe_run(a, world, save_dir, resume=False):
    import zoe
    import zoe.integrations
    import zoe.integrations.accelerate as za
    import zoe.torch
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup
    accelerator = Accelerator(gradient_accumulation_steps=a.accum)
    engine = zoe.Engine(zoe.integrations.config_from(lr=LR, weight_decay=WD, max_grad_norm=CLIP,
                                                     zoe_config={"zero_optimization": {"stage": a.stage}},
                                                     device=accelerator.device))
    model = zoe.torch.wrap(tiny_gpt2(), engine)
    opt = zoe.integrations.ZoeOptimizer(engine, lr=LR, weight_decay=WD)
    # A prepared scheduler steps num_processes times per optimizer step: size it in those units.
    sched = get_linear_schedule_with_warmup(opt, WARMUP * world, STEPS * world)
    if not resume:  # fp16's GradScaler would step the facade optimizer and scale the loss twice
        fp16 = types.SimpleNamespace(mixed_precision="fp16", scaler=None, num_processes=world)
        try:
            za.prepare(fp16, model, opt)
            failures.append("prepare() took an fp16 Accelerator")
        except zoe.Error as e:
            if "mixed_precision=\"fp16\"" not in str(e):
                failures.append(f"prepare()'s fp16 refusal does not name it: {e}")
    model, opt, data, sched = za.prepare(accelerator, model, opt, loader(B * world * a.accum * STEPS, B), sched)
    if resume:
        accelerator.load_state(save_dir)
        data = accelerator.skip_first_batches(data, 5 * a.accum)
    out = train(accelerator, model, opt, sched, data, a.accum, steps_done=5 if resume else 0,
                save_at=None if resume else 5, save_dir=save_dir)
    return out, model, engine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--reference")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--workdir")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.reference:
        return reference(a)
    import zoe.integrations.accelerate  # noqa: F401  (sets RANK, WORLD_SIZE, ... from mpirun's)
    from safetensors.torch import load_file
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    from accelerate import PartialState
    PartialState()  # starts torch.distributed
    work = [tempfile.mkdtemp(prefix="zoe_acc_") if rank == 0 else None]
    torch.distributed.broadcast_object_list(work, src=0)
    work = work[0]
    (losses, norms), model, engine = zoe_run(a, world, os.path.join(work, "state"))
    export = os.path.join(work, "final.safetensors")
    engine.export(export)
    engine.close()
    ref = framework_common.shared_reference(__file__, ["--world", str(world), "--accum", str(a.accum)], work)
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, losses)
    means = [sum(col) / world for col in zip(*everyone)]
    worst = max(framework_common.rel(g, w) for g, w in zip(means, ref["losses"]))
    if len(means) != STEPS or worst > 1e-5:
        failures.append(f"per-step losses within {worst:.1e} of the plain loop's ({len(means)} steps)")
    norm_gap = max(framework_common.rel(g, w) for g, w in zip(norms, ref["norms"]))
    if norm_gap > 1e-5:
        failures.append(f"zoe's grad norms within {norm_gap:.1e} of the clipped norms")
    gap = 0.0
    if rank == 0:
        got = load_file(export)
        worst_weight, gap = framework_common.weight_gaps(got, ref["weights"])  # key bias to 1e-3 only
        if gap > 1e-5 or worst_weight > 1e-3:
            failures.append(f"final weights within {gap:.1e} of the plain loop's")
    (again, _), _, engine = zoe_run(a, world, os.path.join(work, "state"), resume=True)
    engine.close()
    if again != losses[5:]:
        failures.append(f"save_state at step 5, load_state: {again} != {losses[5:]}")
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
    return framework_common.report(
        failures, f"zoe in an Accelerate loop vs plain AdamW, stage {a.stage}, {world} ranks, accumulation {a.accum}, "
        f"worst per-step loss {worst:.1e}, grad norm {norm_gap:.1e}, weights {gap:.1e}, resumed bit for bit")

if __name__ == "__main__":
    sys.exit(main())

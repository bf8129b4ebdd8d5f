"""zoe.integrations.lightning.ZoeStrategy against Lightning's own single-process training with
torch AdamW on the same global batch; under mpirun.

    mpirun -np 2 python3 lightning_strategy.py --strategy zoe_stage_3 [--accum 2] [--bf16] [--resume]

A LightningModule around a tiny GPT-2 (transformers' GPT2LMHeadModel) returns AdamW with two
groups (weight decay on 2-D weights only) and a per-step linear warmup and decay (transformers' get_linear_schedule_with_warmup) from
configure_optimizers; the Trainer clips at gradient_clip_val 1.0. Rank 0 first runs the same module
with Lightning's default strategy in a child process (one process, the global batch), then
compares: each step's loss within 1e-5 relative (2e-2 with --bf16, the reference under
"bf16-mixed" autocast), zoe's grad norm within 1e-5 of the norm torch clipped, the final weights
within 1e-5 (strategy.export), and validate() after fit within 1e-6, the module never moved to
the CPU by fit()'s teardown (zoe's parameters: a .cpu() would fetch them all).

--resume: the checkpoint at step 5 resumes here with the uninterrupted run's losses bit for bit,
and in a child process on 1 rank (batches of 2B: the same global batch) within 1e-6; an "nvme" run
(--strategy zoe_stage_3_offload_nvme) takes its directory from $ZOE_NVME_PATH."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

import framework_common

STEPS, B, LR, WD, CLIP, WARMUP = 10, 2, 5e-3, 0.1, 1.0, 3
failures = []


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="zoe_stage_3")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--reference", help="(internal) run Lightning's default strategy, write its record here")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--resume-from", help="(internal) resume this checkpoint on 1 rank, write losses to --out")
    ap.add_argument("--out")
    ap.add_argument("--workdir")
    return ap.parse_args()


dataset = framework_common.dataset
rel = framework_common.rel


def module():
    import pytorch_lightning as pl
    import zoe.integrations.lightning  # noqa: F401  (the reference too: it makes LightningModules importable here)
    from transformers import get_linear_schedule_with_warmup

    class TinyGPT2(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = framework_common.tiny_gpt2()
            self.losses, self.norms, self.val = [], [], []

        def training_step(self, batch, i):
            loss = self.model(**batch).loss
            self.losses.append(loss.item())
            return loss

        def validation_step(self, batch, i):
            loss = self.model(**batch).loss
            self.val.append(loss.item())
            self.log("val_loss", loss, sync_dist=True)

        def on_before_optimizer_step(self, optimizer):
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            if grads:  # Lightning's own strategy: the norm it is about to clip
                self.norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item())

        def configure_optimizers(self):
            params = [p for p in self.parameters() if p.requires_grad]
            opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
                                     {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=LR)
            sched = get_linear_schedule_with_warmup(opt, WARMUP, STEPS)  # transformers' usual schedule
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
    return TinyGPT2()


def loader(n, batch, seed=1, rank=0, world=1):
    """Rank `rank`'s share of global batches of world * batch samples, in order: the samples of the
    reference's batch k are the ranks' batches k, rank 0's first (what a 1-rank run reads too)."""
    data = dataset(n, seed)
    mine = [i for k in range(n // (world * batch)) for i in range(k * world * batch + rank * batch,
                                                                  k * world * batch + (rank + 1) * batch)]
    return torch.utils.data.DataLoader(torch.utils.data.Subset(data, mine), batch_size=batch, shuffle=False)


def trainer(strategy, devices, accum, bf16, work, callbacks=()):
    import pytorch_lightning as pl
    return pl.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_steps=STEPS,
                      gradient_clip_val=CLIP, accumulate_grad_batches=accum, precision="bf16-mixed" if bf16 else "32-true",
                      logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=work,
                      enable_checkpointing=bool(callbacks), callbacks=list(callbacks), num_sanity_val_steps=0,
                      use_distributed_sampler=False)  # loader() gives each rank its share


class Batches:
    """A rank's batches, resumable inside an epoch: Lightning keeps a loader's state_dict() in its
    checkpoints and hands it back on resume (a plain DataLoader would start the epoch's data over
    at the checkpoint's batch index, under any strategy)."""

    def __init__(self, loader):
        self.batches, self.start, self.position = list(loader), 0, 0

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        start, self.start = self.start, 0
        for i in range(start, len(self.batches)):
            self.position = i + 1
            yield self.batches[i]

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.start = state["position"]


def step_losses(m, accum):
    return [sum(m.losses[i:i + accum]) / accum for i in range(0, len(m.losses), accum)]


def run_reference(a):
    m = module()
    t = trainer("auto", 1, a.accum, a.bf16, os.path.join(a.workdir, "reference"))
    t.fit(m, loader(B * a.world * a.accum * STEPS, B * a.world))
    m.val.clear()
    t.validate(m, loader(8, 4, seed=2), verbose=False)
    with open(a.reference, "w") as f:
        json.dump({"losses": step_losses(m, a.accum), "norms": m.norms, "val": sum(m.val) / len(m.val),
                   "weights": {k: v.float().tolist() for k, v in m.model.state_dict().items()}}, f)


class Norms:
    """Records zoe's grad norm after each step (a Lightning callback, made lazily)."""
    @staticmethod
    def make():
        import pytorch_lightning as pl

        class _Norms(pl.Callback):
            def on_train_batch_end(self, t, m, *rest):
                n = t.strategy.grad_norm
                if n is not None and (not m.norms or t.global_step > len(m.norms)):
                    m.norms.append(n)
        return _Norms()


def zoe_fit(a, work, devices, accum, ckpt_every=None, ckpt_path=None, batch=B):
    import pytorch_lightning as pl
    m = module()
    callbacks = [Norms.make()]
    if ckpt_every:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=os.path.join(work, "ckpt"), every_n_train_steps=ckpt_every,
                                                      save_top_k=-1, filename="{step}"))
    t = trainer(a.strategy, devices, accum, a.bf16, work, callbacks)
    m.moved_to_cpu = 0  # Lightning's own teardown moves the module to the CPU; zoe's must not
    m.cpu = lambda *args, **kwargs: setattr(m, "moved_to_cpu", m.moved_to_cpu + 1) or type(m).cpu(m, *args, **kwargs)
    rank = int(os.environ.get("RANK", "0"))
    t.fit(m, Batches(loader(batch * devices * accum * STEPS, batch, rank=rank, world=devices)), ckpt_path=ckpt_path)
    return t, m


def resume_one_rank(a):
    import zoe.integrations.lightning  # noqa: F401
    t, m = zoe_fit(a, a.workdir + "/one_rank", 1, a.accum, ckpt_path=a.resume_from, batch=B * a.world)
    with open(a.out, "w") as f:
        json.dump(step_losses(m, a.accum), f)
    t.strategy.close_engine()


def gather(obj, world):
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, obj)
    return everyone


def main():
    a = parse()
    torch.set_num_threads(1)
    if a.reference:
        return run_reference(a)
    if a.resume_from:
        return resume_one_rank(a)
    import zoe.integrations.lightning  # noqa: F401  (sets RANK, WORLD_SIZE, ... and registers zoe_stage_*)
    from safetensors.torch import load_file
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    own = tempfile.mkdtemp(prefix="zoe_pl_")  # each rank's trainer root; rank 0's is the shared one
    t, m = zoe_fit(a, own, world, a.accum, ckpt_every=5 if a.resume else None)
    work = t.strategy.broadcast(own)
    ref = framework_common.shared_reference(__file__, ["--world", str(world), "--accum", str(a.accum)] +
                                            (["--bf16"] if a.bf16 else []), work)
    tol = 2e-2 if a.bf16 else 1e-5
    means = [sum(col) / world for col in zip(*gather(step_losses(m, a.accum), world))]
    worst = max(rel(g, w) for g, w in zip(means, ref["losses"]))
    if len(means) != STEPS or worst > tol:
        failures.append(f"per-step losses within {worst:.1e} of Lightning's own, not {tol} ({len(means)} steps)")
    if m.moved_to_cpu:
        failures.append(f"fit() moved the module to the CPU {m.moved_to_cpu} time(s) (its teardown)")
    norm_gap = max(rel(g, w) for g, w in zip(m.norms, ref["norms"]))
    if len(m.norms) != STEPS or norm_gap > (5e-2 if a.bf16 else 1e-5):
        failures.append(f"zoe's grad norms {m.norms[:3]}... within {norm_gap:.1e} of torch's {ref['norms'][:3]}...")
    gap = 0.0
    if not a.bf16:
        path = os.path.join(work, "final.safetensors")
        t.strategy.export(path)
        t.strategy.barrier()
        if rank == 0:
            got = load_file(path)
            worst_weight, gap = framework_common.weight_gaps({k[len("model."):]: v for k, v in got.items()},
                                                             ref["weights"])  # key bias to 1e-3 only
            if gap > 1e-5 or worst_weight > 1e-3 or len(got) < 20:
                failures.append(f"final weights within {gap:.1e} of Lightning's own ({len(got)} tensors)")
        m.val.clear()
        t.validate(m, loader(8, 4 // world, seed=2, rank=rank, world=world), verbose=False)
        val = sum(sum(v) for v in gather(m.val, world)) / sum(len(v) for v in gather(m.val, world))
        if rel(val, ref["val"]) > 1e-6:
            failures.append(f"validate() after fit: {val} vs Lightning's own {ref['val']}")
    if a.resume:
        resume_checks(a, rank, world, work, m)
        validate_then_fit_is_refused(a, rank, world, work)
    t.strategy.close_engine()
    shutil.rmtree(own, ignore_errors=True)
    return framework_common.report(
        failures, f"ZoeStrategy ({a.strategy}) vs Lightning's own, {world} ranks, accumulation {a.accum}"
        f"{', bf16' if a.bf16 else ''}, worst per-step loss {worst:.1e}, grad norm {norm_gap:.1e}, weights {gap:.1e}"
        f"{', resumed bit for bit (1 rank within 1e-6)' if a.resume else ''}")

def validate_then_fit_is_refused(a, rank, world, work):
    """A strategy that wrapped the module for validate() (no optimizer then) refuses fit()."""
    import zoe
    m = module()
    t = trainer(a.strategy, world, a.accum, a.bf16, os.path.join(work, "vf"))
    t.validate(m, loader(8, 4 // world, seed=2, rank=rank, world=world), verbose=False)
    try:
        t.fit(m, Batches(loader(B * world * STEPS, B, rank=rank, world=world)))
        failures.append("fit() after validate() on the same ZoeStrategy trained")
    except zoe.Error as e:
        if "fit() after validate()" not in str(e):
            failures.append(f"fit() after validate(): {e}")
    t.strategy.close_engine()


def resume_checks(a, rank, world, work, first):
    ckpt = os.path.join(work, "ckpt", "step=5.ckpt")
    want = step_losses(first, a.accum)[5:]
    t, m = zoe_fit(a, os.path.join(work, "again"), world, a.accum, ckpt_path=ckpt)
    if step_losses(m, a.accum) != want:
        failures.append(f"resumed on {world} ranks: {step_losses(m, a.accum)} != {want}")
    t.strategy.close_engine()
    mean = [sum(col) / world for col in zip(*gather(want, world))]
    if rank == 0:
        out = os.path.join(work, "one_rank.json")
        # The same global batch as one batch of B * world: Lightning counts batch indices (its loop
        # state), so a resume that changed the accumulation would step at other boundaries.
        cmd = [sys.executable, __file__, "--strategy", a.strategy, "--accum", str(a.accum), "--world", str(world),
               "--resume-from", ckpt, "--out", out, "--workdir", work]
        r = subprocess.run(cmd, env=framework_common.child_env(), capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"1-rank resume failed: {r.stderr[-2000:]}")
        elif max(rel(g, w) for g, w in zip(json.load(open(out)), mean)) > 1e-6 or len(json.load(open(out))) != 5:
            # One batch of 2B against the mean of two of B: another summation order, so 1e-6.
            failures.append(f"resumed on 1 rank (batches of {B * world}): {json.load(open(out))} != {mean}")


if __name__ == "__main__":
    sys.exit(main())

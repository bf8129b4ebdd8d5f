"""zoe.integrations against plain PyTorch, the way a framework drives an optimizer; under mpirun.

    mpirun -np 2 python3 integrations.py --stage 3 [--accum 2]

A framework-style loop (a torch LR scheduler with linear warmup then linear decay stepping the
optimizer's lr, clipping at 1.0, weight decay on 2-D weights) trains a wrapped model through
zoe.integrations.ZoeOptimizer with config_from's config; beside it, plain PyTorch AdamW with the
same scheduler and torch.nn.utils.clip_grad_norm_ trains on every rank's batches together. Each
step's loss on this rank's batch must agree to 1e-5 relative, and so must the final weights. The
facade's state_dict, loaded into a fresh facade, gives a resumed scheduler the same lr;
config_from refuses a value given differently in both places; and (stage 0) torch_distributed_env
lets torch.distributed start over mpirun's ranks."""
import argparse
import os
import sys

import torch

import zoe
import zoe.integrations
import zoe.torch
from tiny_lm import TinyLM, batch

LR, WD, CLIP, STEPS, WARMUP = 1e-2, 0.1, 1.0, 10, 3

failures = []


def schedule(step):
    """Linear warmup over WARMUP steps, then linear decay to 0 at STEPS (transformers' default)."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    return max(0.0, (STEPS - step) / (STEPS - WARMUP))


def reference_optimizer(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}], lr=LR)


def config_checks():
    cfg = zoe.integrations.config_from(lr=1e-3, weight_decay=0.1, max_grad_norm=1.0, bf16=True,
                                       zoe_config={"zero_optimization": {"stage": 3},
                                                   "optimizer": {"params": {"lr": "auto"}}})
    if cfg["optimizer"]["params"]["lr"] != 1e-3 or cfg["gradient_clipping"] != 1.0 or not cfg["bf16"]["enabled"]:
        failures.append(f"config_from: {cfg}")
    if cfg["zero_optimization"] != {"stage": 3} or cfg["gradient_accumulation_steps"] != 1:
        failures.append(f"config_from lost or changed zoe's keys: {cfg}")
    for zoe_config, needle in (({"optimizer": {"params": {"lr": 2e-3}}}, "'optimizer.params.lr' is 0.002"),
                               ({"gradient_clipping": 0.5}, "'gradient_clipping' is 0.5"),
                               ({"gradient_accumulation_steps": 4}, "'gradient_accumulation_steps' is 4"),
                               ({"bf16": {"enabled": False}}, "'bf16.enabled' is False")):
        try:
            zoe.integrations.config_from(lr=1e-3, max_grad_norm=1.0, bf16=True, zoe_config=zoe_config)
            failures.append(f"config_from accepted {zoe_config}")
        except zoe.Error as e:
            if needle not in str(e) or "from the framework's arguments" not in str(e):
                failures.append(f"config_from's message '{e}' lacks '{needle}'")
    # The framework's device: a GPU makes zoe.device cuda (zoe hands out GPU memory there) and its
    # index zoe.gpu (without one, zoe takes the local rank's); on the CPU zoe_config's stays;
    # weights on the GPU for a framework on the CPU are refused, as is another device or GPU for a
    # framework on the GPU.
    on_gpu = zoe.integrations.config_from(lr=1e-3, zoe_config={"zoe": {"nvme_path": "/x"}}, device=torch.device("cuda", 1))
    if on_gpu["zoe"] != {"nvme_path": "/x", "device": "cuda", "gpu": 1}:
        failures.append(f"config_from on a GPU: {on_gpu['zoe']}")
    any_gpu = zoe.integrations.config_from(lr=1e-3, device="cuda")
    if any_gpu["zoe"] != {"device": "cuda"}:
        failures.append(f"config_from on 'cuda' (no index): {any_gpu['zoe']}")
    for device, zoe_config in ((None, {}), ("cpu", {}), ("cpu", {"zoe": {"device": "cpu-strict"}})):
        cfg = zoe.integrations.config_from(lr=1e-3, zoe_config=zoe_config, device=device)
        if cfg.get("zoe") != zoe_config.get("zoe"):
            failures.append(f"config_from on the CPU ({device}) changed zoe's device: {cfg.get('zoe')}")
    for device, zoe_config, needle in (("cpu", {"zoe": {"device": "cuda"}}, "the framework computes on the CPU"),
                                       ("cuda:0", {"zoe": {"device": "cpu"}}, "'zoe.device' is 'cpu' in zoe_config"),
                                       ("cuda:1", {"zoe": {"gpu": 0}}, "'zoe.gpu' is 0 in zoe_config but 1")):
        try:
            zoe.integrations.config_from(lr=1e-3, zoe_config=zoe_config, device=device)
            failures.append(f"config_from accepted {zoe_config} for a framework on {device}")
        except zoe.Error as e:
            if needle not in str(e):
                failures.append(f"config_from's message '{e}' lacks '{needle}'")


def distributed_env_checks():
    """Under mpirun, torch_distributed_env sets what torch.distributed's env:// reads: a gloo
    all_reduce over it then sums every rank's value."""
    import torch.distributed as dist
    added = zoe.integrations.torch_distributed_env()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank != int(os.environ["OMPI_COMM_WORLD_RANK"]) or "MASTER_ADDR" not in os.environ:
        failures.append(f"torch_distributed_env set {added}")
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if t.item() != world * (world + 1) / 2:
        failures.append(f"gloo all_reduce over torch_distributed_env's variables gave {t.item()}")
    dist.destroy_process_group()
    for environ, needle in (({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0",
                              "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "set MASTER_ADDR"),
                            ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
                              "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "RANK": "0"},
                             "RANK=0 but Open MPI says 1")):
        try:
            zoe.integrations.torch_distributed_env(environ)
            failures.append(f"torch_distributed_env accepted {environ}")
        except zoe.Error as e:
            if needle not in str(e):
                failures.append(f"torch_distributed_env's message '{e}' lacks '{needle}'")
    if zoe.integrations.torch_distributed_env({}) != {}:
        failures.append("torch_distributed_env set variables without mpirun")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--accum", type=int, default=1, help="the framework's gradient accumulation steps")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config_checks()
    if a.stage == 0:
        distributed_env_checks()
    cfg = zoe.integrations.config_from(lr=LR, weight_decay=WD, max_grad_norm=CLIP, zoe_config={
        "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": a.stage}})
    engine = zoe.Engine(cfg)
    rank, world = engine.rank, engine.world_size
    torch.manual_seed(0)
    model = TinyLM()
    torch.manual_seed(0)
    ref = TinyLM()
    zoe.torch.wrap(model, engine)
    opt = zoe.integrations.ZoeOptimizer(engine, lr=LR, weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    ref_opt = reference_optimizer(ref)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, schedule)
    worst = 0.0
    saved = None
    for step in range(STEPS):
        # The framework's accumulation: each micro-batch's loss divided by a.accum, one step after
        # the last (zoe's own gradient_accumulation_steps stays 1: its hand-overs add up).
        micro = [step * a.accum + m for m in range(a.accum)]
        losses = []
        for m in micro:
            loss = model(*batch(m, rank))
            (loss / a.accum).backward()
            losses.append(loss.item())
        opt.step()
        sched.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        ref_losses = [[ref(*batch(m, r)) for m in micro] for r in range(world)]
        (sum(sum(ls) for ls in ref_losses) / (world * a.accum)).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP).item()
        ref_lr = ref_opt.param_groups[0]["lr"]
        ref_opt.step()
        ref_sched.step()
        for got, want in zip(losses, ref_losses[rank]):
            worst = max(worst, abs(got - want.item()) / abs(want.item()))
        if abs(opt.grad_norm - ref_norm) > 1e-5 * ref_norm:
            failures.append(f"step {step}: grad_norm {opt.grad_norm} vs torch's {ref_norm}")
        if abs(opt.last_step["lr"] - ref_lr) > 1e-12 * LR:
            failures.append(f"step {step}: zoe stepped at lr {opt.last_step['lr']}, torch at {ref_lr}")
        if step == 4:
            saved = (opt.state_dict(), sched.state_dict())
    if worst > 1e-5:
        failures.append(f"worst per-step loss gap {worst:.1e} > 1e-5")
    with zoe.torch.gathered(model):
        gap = max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
                  for p, q in zip(model.parameters(), ref.parameters()))
    if gap > 1e-5:
        failures.append(f"final weights within {gap:.1e}, not 1e-5")
    # A resumed run: a fresh facade and scheduler from step 5's state set step 5's lr.
    resumed = zoe.integrations.ZoeOptimizer(engine, lr=LR)
    resumed_sched = torch.optim.lr_scheduler.LambdaLR(resumed, schedule)
    resumed.load_state_dict(saved[0])
    resumed_sched.load_state_dict(saved[1])
    if abs(resumed.param_groups[0]["lr"] - LR * schedule(5)) > 1e-12:
        failures.append(f"resumed lr {resumed.param_groups[0]['lr']}, not {LR * schedule(5)}")
    engine.close()
    for f in failures:
        print(f"rank {rank}: FAIL: {f}", flush=True)
    if rank == 0:
        print(f"{'PASS' if not failures else 'FAIL'}: zoe.integrations vs torch AdamW + LambdaLR + clipping, "
              f"stage {a.stage}, {world} ranks, accumulation {a.accum}, worst rel {worst:.1e}, weights within {gap:.1e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

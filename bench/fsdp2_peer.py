#!/usr/bin/env python3
"""The PyTorch side of bench/fsdp2_compare.sh: the GPT-2 of bench/torch_gpt2_step.py trained with
FSDP2 (`fully_shard` per block and on the root: ZeRO-3), bf16 compute (MixedPrecisionPolicy: bf16
parameters for the products, fp32 gradient reduction, fp32 sharded master weights and AdamW
state), on CPU ranks over gloo. Launch one process per rank (torch.distributed.run). Rank r reads
the micro-batch at offset (step*N + r)*B*T of --data, as zoe does. Rank 0 prints one JSON line:
median and best step seconds of the steps after --warmup, tokens per second of the global batch,
each rank's peak RSS (getrusage), the losses."""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_step import Gpt2  # noqa: E402  the same model, init and loss


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for k, v in dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024, B=2, T=128,
                     threads=1, warmup=2, iters=6).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--data", required=True, help="a file whose bytes are the tokens")
    a = ap.parse_args()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Gpt2(a)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.h:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    ps = list(model.parameters())
    groups = [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    n, BT = a.warmup + a.iters, a.B * a.T
    raw = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    steps, losses = [], []
    for i in range(n):
        off = ((i * world + rank) * BT) % (raw.numel() - BT - 1)
        x, y = raw[off:off + BT].view(a.B, a.T), raw[off + 1:off + BT + 1].view(a.B, a.T)
        dist.barrier()
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ps, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        steps.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.int64)
    all_rss = [torch.zeros_like(rss) for _ in range(world)]
    dist.all_gather(all_rss, rss)
    timed = steps[a.warmup:]
    if rank == 0:
        med = statistics.median(timed)
        print(json.dumps({"median_step_s": med, "best_step_s": min(timed), "tokens_per_s": world * BT / med,
                          "peak_rss_bytes": [int(r.item()) for r in all_rss], "loss": [losses[0], losses[-1]],
                          "torch": torch.__version__, "ranks": world, "threads": torch.get_num_threads()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Trains transformers' GPT2LMHeadModel through zoe at ZeRO stage 3, parameters and optimizer
state on NVMe, over MPI ranks; prints the loss and each rank's memory ledger.

    mpirun -np 2 python3 examples/torch_gpt2.py [--steps 20] [--nvme /tmp/zoe_nvme] [--layers 2]

(As root add OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 and --oversubscribe.)
Where transformers is missing, a plain-PyTorch GPT of the same shape stands in. Tokens are the
bytes of data/corpus.txt (vocabulary 256); each rank reads its own windows."""
import argparse
import os
import shutil
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import zoe
import zoe.torch

HERE = os.path.dirname(os.path.abspath(__file__))


def gpt2(layers, width, heads, ctx):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return PlainGpt(layers, width, heads, ctx), "plain PyTorch GPT (transformers not installed)"
    cfg = GPT2Config(vocab_size=256, n_positions=ctx, n_embd=width, n_layer=layers, n_head=heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg), "transformers.GPT2LMHeadModel"


class PlainBlock(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class PlainGpt(nn.Module):
    def __init__(self, layers, c, heads, ctx):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, c), nn.Embedding(ctx, c)
        self.h = nn.ModuleList([PlainBlock(c, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, 256, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, labels):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 256), labels[:, 1:].reshape(-1))
        return type("Out", (), {"loss": loss})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--nvme", default="/tmp/zoe_torch_gpt2_nvme")
    a = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    if rank == 0:
        shutil.rmtree(a.nvme, ignore_errors=True)
    os.makedirs(a.nvme, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, kind = gpt2(a.layers, a.width, 4, a.ctx)
    # The ds_config keys of `zoe train`: stage 3, parameters and optimizer state on NVMe.
    engine = zoe.Engine({
        "train_micro_batch_size_per_gpu": a.batch,
        "zero_optimization": {"stage": 3,
                              "offload_param": {"device": "nvme", "nvme_path": a.nvme},
                              "offload_optimizer": {"device": "nvme", "nvme_path": a.nvme}},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
    })
    zoe.torch.wrap(model, engine)
    data = torch.frombuffer(bytearray(open(os.path.join(HERE, "..", "data", "corpus.txt"), "rb").read()),
                            dtype=torch.uint8).long()
    if engine.rank == 0:
        print(f"{kind}: {engine.num_params} parameters in {engine.num_units} units, {engine.world_size} ranks, "
              f"ZeRO-3, parameters and optimizer on NVMe ({a.nvme})", flush=True)
    g = torch.Generator().manual_seed(engine.rank)
    for step in range(a.steps):
        starts = torch.randint(0, len(data) - a.ctx, (a.batch,), generator=g)
        ids = torch.stack([data[s:s + a.ctx] for s in starts.tolist()])
        loss = model(input_ids=ids, labels=ids).loss
        (loss * engine.loss_scale).backward()
        r = engine.step()
        if engine.rank == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}  grad_norm {r['grad_norm']:.3f}", flush=True)
    led = engine.stats()["ledger"]
    for tier in ("device", "host", "nvme"):
        kinds = {k: v for k, v in led[tier].items() if v and k not in ("peak", "persistent")}
        print(f"rank {engine.rank} ledger {tier}: {kinds} peak {led[tier]['peak']}", flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""DeepSpeed ZeRO-3 with offload (ZeRO-Infinity) on a GPT-2 as its users run it: the peer of
zoe's offloaded step on one GPU (issue 48; bench/deepspeed_peer.sh runs both).

    python3 bench/deepspeed_peer.py --offload nvme --nvme-path /tmp/ds --steps 8 --json out.json

One process (rank 0 of 1, the env:// rendezvous set here), `deepspeed.zero.Init` building the
model partitioned, `deepspeed.initialize` with ZeRO stage 3, `offload_param` and
`offload_optimizer` on NVMe (or CPU), bf16, DeepSpeed's own CPU Adam (DeepSpeedCPUAdam, built on
first use), gradient clipping 1.0 as zoe's job. The model is GPT-2's (pre-norm blocks, causal
attention through torch's scaled_dot_product_attention, GELU tanh, the head tied to the token
embedding); tokens are data/corpus.txt's bytes, windows at fixed offsets as zoe's byte loader
takes them. Prints and writes: tokens/s (median of the steps after the first two), the losses,
peak GPU memory (torch.cuda.max_memory_allocated, what zoe's budget is then set to, and
max_memory_reserved, what the caching allocator held) and peak RSS. On NVMe every parameter
partition is there (offload_param.max_in_cpu 0).
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# GPT-2's initialisation (normal, std 0.02; zero biases) in reset_parameters, which the layers
# run inside their own __init__: under deepspeed.zero.Init a parameter is partitioned as soon as
# its module's __init__ returns, so a later pass over the model would write to empty shards.
class Linear(nn.Linear):
    def reset_parameters(self):
        nn.init.normal_(self.weight, std=0.02)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Embedding(nn.Embedding):
    def reset_parameters(self):
        nn.init.normal_(self.weight, std=0.02)


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.c_proj = Linear(c, 3 * c), Linear(c, c)
        self.c_fc, self.mlp_proj = Linear(c, 4 * c), Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte, self.wpe = Embedding(a.vocab, a.embd), Embedding(a.positions, a.embd)
        self.blocks = nn.ModuleList(Block(a.embd, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.embd)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def ds_config(a):
    off = {"device": a.offload, "pin_memory": True}
    if a.offload == "nvme":
        off["nvme_path"] = a.nvme_path
    param = dict(off)
    if a.offload == "nvme":
        # DeepSpeed keeps up to max_in_cpu (default 1e9) parameter elements in pinned host memory
        # and swaps only the rest to NVMe: GPT-2 124M would never reach the disk. 0: every
        # parameter partition lives on NVMe, as ZeRO-Infinity's parameter offload means. Each
        # parameter swapped in takes one of buffer_count pinned buffers of buffer_size elements:
        # its default 5 fails ("Not enough buffers 0 for swapping 1") once a block and what is
        # prefetched hold more, so every swappable tensor gets one (four a block, the two
        # embeddings and two spare), each the size of the largest (the token embedding).
        param["max_in_cpu"] = 0
        param["buffer_count"] = 4 * a.layers + 4
        largest = max(a.vocab * a.embd, 4 * a.embd * a.embd)
        param["buffer_size"] = -(-largest // (1 << 20)) * (1 << 20)
    # With parameters on NVMe, DeepSpeed's NVMe prefetch swaps the tied embedding in twice and
    # fails ("param N already assigned swap buffer id", after the first step: DeepSpeed issues
    # 3062, Megatron-DeepSpeed 196); its users' way round it is no prefetch (bucket 0).
    nvme_prefetch = {"stage3_prefetch_bucket_size": 0} if a.offload == "nvme" else {}
    return {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "offload_param": param, "offload_optimizer": dict(off),
                              "overlap_comm": True, "contiguous_gradients": True, **nvme_prefetch},
        "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": False, "overlap_events": True},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--offload", choices=["nvme", "cpu"], default="nvme")
    ap.add_argument("--nvme-path", default="out/ds-nvme")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                   "corpus.txt"))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                 ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    import setuptools  # noqa: F401  (first: its distutils shim, which DeepSpeed's op builder imports)
    import deepspeed  # after the environment: it reads the rendezvous at import and init
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(0)
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo")
    if a.offload == "nvme":
        os.makedirs(a.nvme_path, exist_ok=True)
    cfg = ds_config(a)
    torch.manual_seed(1234)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = Gpt2(a)
    params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    tokens_per_step = a.micro_batch * a.seq
    times, losses = [], []
    for step in range(a.steps):
        starts = [(step * a.micro_batch + i) * a.seq % (len(data) - a.seq - 1) for i in range(a.micro_batch)]
        batch = torch.stack([data[s:s + a.seq + 1] for s in starts]).to(device)
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print(f"step {step} loss {losses[-1]:.4f} {times[-1]:.3f} s", flush=True)
    steady = times[2:] if len(times) > 2 else times
    med = statistics.median(steady)
    out = {"peer": "deepspeed", "deepspeed": deepspeed.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if gpu else "cpu", "offload": a.offload,
           "params": params, "micro_batch": a.micro_batch, "seq": a.seq, "median_step_s": med,
           "tokens_per_s": tokens_per_step / med, "losses": losses, "step_s": times,
           "peak_gpu_bytes": torch.cuda.max_memory_allocated() if gpu else 0,
           "peak_gpu_reserved_bytes": torch.cuda.max_memory_reserved() if gpu else 0,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    print(json.dumps({k: v for k, v in out.items() if k not in ("losses", "step_s")}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    raise SystemExit(main())

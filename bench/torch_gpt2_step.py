#!/usr/bin/env python3
"""The PyTorch side of `zoe bench step`: trains a GPT-2 (nanoGPT-style, AdamW) for --warmup +
--iters steps on the bytes of --data (llm.c order, as zoe reads them; random bytes without --data)
and prints one JSON line with the best and the median step time and the mean forward / backward /
optimizer seconds of the timed steps. --mode: eager (fp32), autocast_bf16 (CPU autocast to bf16,
as PyTorch trains bf16 on a CPU), compile (torch.compile of eager), compile_autocast_bf16 (both),
eager_tf32 (eager with torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32 on); a
mode this torch lacks prints {"unsupported": why}. Where torch has them it uses its fastest pieces: scaled_dot_product_attention
and the fused AdamW.

Same model as zoe's: pre-LayerNorm (eps 1e-5), learned positions, GELU tanh, causal attention,
tied LM head; init normal(0, 0.02), residual projections 0.02/sqrt(2*n_layer), biases 0.
"""
import argparse
import contextlib
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5), torch.nn.LayerNorm(C, eps=1e-5)
        self.c_attn, self.attn_proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.c_fc, self.mlp_proj = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)

    def attention(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.nh))
            y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, mask):
        x = x + self.attention(self.ln_1(x), mask)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        C = a.n_embd
        self.wte = torch.nn.Embedding(a.vocab_size, C)
        self.wpe = torch.nn.Embedding(a.n_positions, C)
        self.h = torch.nn.ModuleList(Block(C, a.n_head) for _ in range(a.n_layer))
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif "ln_" in name:
                torch.nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * a.n_layer) if name.endswith("proj.weight") else 0.02
                torch.nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).triu(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x, mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    for k, v in dict(n_layer=6, n_head=6, n_embd=384, vocab_size=256, n_positions=256, B=4, T=256,
                     threads=1, warmup=2, iters=5).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    for k, v in dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0).items():
        ap.add_argument(f"--{k}", type=float, default=v)
    ap.add_argument("--data", default="", help="a file whose bytes are the tokens")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--mode", default="eager", choices=["eager", "autocast_bf16", "compile", "compile_autocast_bf16",
                                                          "eager_tf32"])
    a = ap.parse_args()
    if a.mode.startswith("compile") and not hasattr(torch, "compile"):
        print(json.dumps({"unsupported": f"torch {torch.__version__} has no torch.compile", "torch": torch.__version__}))
        return
    dev = torch.device(a.device)
    if a.mode == "eager_tf32":  # PyTorch's own switch for TF32 products (and cuDNN's)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # A GPU runs asynchronously: each timestamp waits for the work queued before it.
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Gpt2(a).to(dev)
    ps = list(model.parameters())
    groups = [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": a.weight_decay},
              {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
    try:  # the fused kernel where this torch has one for the device
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    run = torch.compile(model) if a.mode.startswith("compile") else model
    autocast = (lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)) if a.mode.endswith("autocast_bf16") \
        else contextlib.nullcontext
    n, BT = a.warmup + a.iters, a.B * a.T
    if a.data:  # micro-batch i: the B*T+1 tokens at i*B*T
        raw = torch.frombuffer(bytearray(open(a.data, "rb").read(n * BT + 1)), dtype=torch.uint8).long()
        data = [(raw[i * BT:(i + 1) * BT].view(a.B, a.T), raw[i * BT + 1:(i + 1) * BT + 1].view(a.B, a.T))
                for i in range(n)]
    else:
        rnd = torch.randint(0, a.vocab_size, (n, a.B, a.T + 1))
        data = [(rnd[i, :, :-1].contiguous(), rnd[i, :, 1:].contiguous()) for i in range(n)]
    steps, fwd, bwd, optim, losses = [], 0.0, 0.0, 0.0, []
    for i in range(n):
        x, y = (t.to(dev) for t in data[i])
        sync()
        t0 = time.perf_counter()
        with autocast():
            loss = run(x, y)
        sync()
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sync()
        t2 = time.perf_counter()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(ps, a.clip)
        opt.step()
        sync()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if i >= a.warmup:
            steps.append(t3 - t0)
            fwd, bwd, optim = fwd + (t1 - t0) / a.iters, bwd + (t2 - t1) / a.iters, optim + (t3 - t2) / a.iters
    print(json.dumps({"step_s": min(steps), "median_step_s": statistics.median(steps), "forward_s": fwd,
                      "backward_s": bwd, "optimizer_s": optim, "threads": torch.get_num_threads(),
                      "torch": torch.__version__, "mode": a.mode, "loss": [losses[0], losses[-1]]}))


if __name__ == "__main__":
    main()

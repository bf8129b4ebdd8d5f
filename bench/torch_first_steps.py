# The first steps of a fresh GPT-2 in PyTorch, as bench/out_of_core.sh trains zoe's: transformers'
# GPT2LMHeadModel in fp32 (HF's init), AdamW (weight decay 0.1 on matrices), gradient clipping 1.0,
# WarmupLR linear from lr0 to 1e-4 over 1000 steps, batches of 64 bytes of data/corpus.txt in order.
# Prints each step's loss and gradient norm: the reference for whether a schedule trains a model.
#   /usr/bin/python3 bench/torch_first_steps.py N_LAYER N_EMBD N_HEAD LR0 [STEPS]
import os
import sys

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel
L, D, H, lr0 = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
torch.manual_seed(0)
cfg = GPT2Config(n_layer=L, n_head=H, n_embd=D, vocab_size=50257, n_positions=1024, activation_function="gelu_new",
                 layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
m = GPT2LMHeadModel(cfg)
ps = list(m.parameters())
opt = torch.optim.AdamW([{"params": [p for p in ps if p.dim() >= 2], "weight_decay": 0.1},
                         {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}],
                        lr=lr0, betas=(0.9, 0.999), eps=1e-8)
corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "corpus.txt")
tok = np.fromfile(corpus, dtype=np.uint8).astype(np.int64)
T, pos = 64, 0
for step in range(steps):
    x = torch.from_numpy(tok[pos:pos + T]).view(1, T)
    y = torch.from_numpy(tok[pos + 1:pos + T + 1]).view(1, T)
    pos += T
    lr = lr0 + (1e-4 - lr0) * step / 1000
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad()
    logits = m(x).logits
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    print(f"L{L} D{D} lr0 {lr0}: step {step + 1} loss {loss.item():.4f} grad_norm {gn.item():.2f}", flush=True)

"""A small GPT-like PyTorch model for zoe's Python tests: token and position embeddings, pre-norm
MLP blocks with residuals, and an output layer tied to the token embedding."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(self.ln(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab=32, c=16, n_layer=2, t=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(t, c)
        self.blocks = nn.ModuleList([Block(c) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # A buffer the forward reads (as a causal mask or rotary frequencies are): zoe.torch.wrap
        # places it on zoe's device with the weights.
        self.register_buffer("positions", torch.arange(t), persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(self.positions[:idx.shape[1]])
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    def head(self, h):
        return self.lm_head(h)


def batch(step, rank, vocab=32, b=4, t=8):
    g = torch.Generator().manual_seed(1000 * step + rank)
    idx = torch.randint(0, vocab, (b, t + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


def adamw(model, lr, wd):
    """torch's AdamW with zoe's decay rule: tensors of two or more dimensions only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.999), eps=1e-8)


class HfGpt2(nn.Module):
    """transformers' GPT2LMHeadModel (dropout off) behind TinyLM's call: (idx, targets) -> loss."""

    def __init__(self, vocab=32, c=16, n_layer=2, t=8):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        self.m = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=t, n_embd=c, n_layer=n_layer, n_head=2,
                                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        self.blocks = self.m.transformer.h

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

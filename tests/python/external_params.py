"""zoe.torch.wrap with parameters read outside their module's forward, against plain PyTorch AdamW;
run under mpirun (stage 3 gathers at every fetch, so every rank takes part).

    mpirun -np 2 python3 external_params.py [--stage 3] [--nvme DIR]

Four models, each trained for a few steps beside a plain PyTorch copy that sees every rank's
batches; each step's loss on this rank's batch must agree to 1e-5 relative, and so must the
weights at the end:
  tied-head   the output head is `h @ self.wte.weight.t()` in the parent's forward
  shared      a decoder whose forward uses the encoder's weight (transposed): one weight read in
              two modules' forwards
  loss        the loss function adds a penalty on a block's weight, computed before the model's
              forward on odd steps and after it on even ones
  registered  tied-head with the weight registered by hand (register_external_parameter): it is
              fetched with the parent, never on demand
The first three must fetch on demand at stage 3 (their parameters are empty there otherwise).
Then reads outside training (no-grad evaluation, a weight's norm, a transposed weight, a forward
that raises) must give plain PyTorch's values and leave no unit fetched."""
import argparse
import os
import sys

# Released buffers read as NaN: a view that outlived its unit's release shows.
os.environ["ZOE_POISON_RELEASED"] = "1"

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import zoe  # noqa: E402
import zoe.torch  # noqa: E402
from tiny_lm import TinyLM, adamw, batch  # noqa: E402

LR, WD, STEPS, PENALTY = 1e-2, 0.01, 4, 0.05


class TiedHead(TinyLM):
    """GPT-like, the head tied to the token embedding by reading its weight in this forward (no
    lm_head module)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        del self.lm_head

    def head(self, h):
        return h @ self.wte.weight.t()


class TiedDecoder(nn.Module):
    """A linear layer whose weight is another layer's, transposed (a tied autoencoder)."""

    def __init__(self, enc):
        super().__init__()
        self.enc = enc
        self.bias = nn.Parameter(torch.zeros(enc.in_features))

    def forward(self, h):
        return F.linear(h, self.enc.weight.t(), self.bias)


class Shared(nn.Module):
    def __init__(self, vocab=32, c=16, t=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(t, c)
        self.ln = nn.LayerNorm(c)
        self.up = nn.Linear(c, 4 * c)
        self.down = TiedDecoder(self.up)
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        x = x + self.down(F.gelu(self.up(self.ln(x))))
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def penalised_loss(model, idx, targets, step):
    """The model's loss plus a penalty read straight from a block's weight, outside any forward."""
    if step % 2:
        penalty = PENALTY * model.blocks[0].fc.weight.square().mean()
        return penalty + model(idx, targets)
    loss = model(idx, targets)
    return loss + PENALTY * model.blocks[0].fc.weight.square().mean()


def plain_loss(model, idx, targets, step):
    return model(idx, targets)


def config(stage, nvme):
    zo = {"stage": stage, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}
    if nvme:
        zo["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme}
        if stage == 3:
            zo["offload_param"] = {"device": "nvme", "nvme_path": nvme}
    return {"train_micro_batch_size_per_gpu": 4, "zero_optimization": zo,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}}}


def parity(name, make, loss_fn, stage, nvme, explicit=False):
    """Trains make() wrapped and plain; returns the list of what went wrong (empty: agreed)."""
    engine = zoe.Engine(config(stage, nvme))
    rank, world = engine.rank, engine.world_size
    torch.manual_seed(12345 if rank else 0)  # other ranks build different values: rank 0's count
    model = make()
    torch.manual_seed(0)
    ref = make()
    opt = adamw(ref, LR, WD)
    zoe.torch.wrap(model, engine)
    if explicit:
        zoe.torch.register_external_parameter(model, model.wte.weight)
    worst, problems = 0.0, []
    for step in range(STEPS):
        loss = loss_fn(model, *batch(step, rank), step)
        loss.backward()
        engine.step()
        opt.zero_grad()
        ref_losses = [loss_fn(ref, *batch(step, r), step) for r in range(world)]
        (sum(ref_losses) / world).backward()
        opt.step()
        got, want = loss.item(), ref_losses[rank].item()
        worst = max(worst, abs(got - want) / abs(want))
        if rank == 0:
            print(f"{name} step {step} loss {got:.7f} reference {want:.7f}", flush=True)
    held = sum(p.numel() for p in model.parameters())
    with zoe.torch.gathered(model):
        gap = max(((p - q).abs().max() / (q.abs().max() + 1e-12)).item()
                  for p, q in zip(model.parameters(), ref.parameters()))
    on_demand = model._zoe.on_demand_fetches
    engine.close()
    if worst > 1e-5:
        problems.append(f"{name}: losses differ by {worst:.1e} relative")
    if gap > 1e-5:
        problems.append(f"{name}: weights differ by {gap:.1e} relative")
    if held:
        problems.append(f"{name}: torch holds {held} parameter elements between steps")
    if stage == 3 and (on_demand == 0) != explicit:
        problems.append(f"{name}: {on_demand} on-demand fetches")
    print(f"rank {rank}: {name}: worst loss rel {worst:.1e}, weights within {gap:.1e}, {on_demand} on-demand fetches",
          flush=True)
    return problems


def reads_outside_training(stage, nvme):
    """Reads without gradients give the true values and leave nothing fetched: an evaluation
    forward, a weight's norm and a transposed weight outside any forward (a view of zoe's buffer
    would not outlive the op: it is copied). A forward that raises leaves nothing fetched either,
    and training then goes on as plain PyTorch's."""
    engine = zoe.Engine(config(stage, nvme))
    rank, world = engine.rank, engine.world_size
    torch.manual_seed(12345 if rank else 0)
    model = TiedHead()
    torch.manual_seed(0)
    ref = TiedHead()
    zoe.torch.wrap(model, engine)
    problems = []
    with torch.no_grad():
        pairs = [("evaluation loss", model(*batch(0, rank)), ref(*batch(0, rank))),
                 ("norm", model.wte.weight.norm(), ref.wte.weight.norm()),
                 ("transposed weight", model.wte.weight.t(), ref.wte.weight.t())]
        for what, got, want in pairs:
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-6, atol=0):
                problems.append(f"outside training: {what} differs from plain PyTorch's")
    try:
        model(torch.full((4, 8), 99), batch(0, rank)[1])  # token ids past the vocabulary
        problems.append("outside training: a forward over bad token ids did not raise")
    except IndexError:
        pass
    held = [u.index for u in model._zoe.units if u.refs]
    if held:
        problems.append(f"outside training: units {held} still fetched")
    opt = adamw(ref, LR, WD)
    loss = model(*batch(1, rank))
    loss.backward()
    engine.step()
    opt.zero_grad()
    (sum(ref(*batch(1, r)) for r in range(world)) / world).backward()
    opt.step()
    with torch.no_grad():
        got, want = model(*batch(2, rank)).item(), ref(*batch(2, rank)).item()
    if abs(got - want) > 1e-5 * abs(want):
        problems.append(f"outside training: loss after a step {got} vs {want}")
    engine.close()
    print(f"rank {rank}: outside training: {len(problems)} problems", flush=True)
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--nvme")
    ap.add_argument("--only", choices=["tied-head", "shared", "loss", "registered", "outside"],
                    help="run one part")
    a = ap.parse_args()
    if a.nvme:
        os.makedirs(a.nvme, exist_ok=True)
    torch.set_num_threads(1)
    models = {"tied-head": (TiedHead, plain_loss, False), "shared": (Shared, plain_loss, False),
              "loss": (TinyLM, penalised_loss, False), "registered": (TiedHead, plain_loss, True)}
    problems = []
    for name, (make, loss_fn, explicit) in models.items():
        if a.only in (None, name):
            problems += parity(name, make, loss_fn, a.stage, a.nvme, explicit)
    if a.only in (None, "outside"):
        problems += reads_outside_training(a.stage, a.nvme)
    for p in problems:
        print("FAIL:", p, flush=True)
    print(f"{'PASS' if not problems else 'FAIL'}: parameters used outside their module, stage {a.stage}"
          f"{', nvme' if a.nvme else ''}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

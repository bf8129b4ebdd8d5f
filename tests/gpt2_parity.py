#!/usr/bin/env python3
"""zoe's GPT-2 against PyTorch; tests/gpt2_parity_test.cc writes the inputs and runs this.

  gpt2_parity.py grads DIR   DIR/weights.safetensors: the model (Hugging Face GPT-2 names);
                             DIR/zoe.safetensors: the batch ("inputs", "targets", int32 [B,T]),
                             zoe's gradients ("grad.<name>") and, as metadata, zoe's loss and the
                             model shape. Checks the loss and every gradient.
  gpt2_parity.py train DIR   DIR/run.json describes a `zoe train` run (AdamW, fp32) that left
                             its report and `zoe export` in DIR. Trains the reference with
                             torch.optim.AdamW on the same batches in llm.c order, checks the
                             losses and gradient norms step by step, then loads zoe's export.
                             With "autocast": "bf16" in run.json the run is bf16 training with
                             bf16 compute, and the reference is the model in fp32 under
                             torch.autocast("cpu", bfloat16), as a torch user trains in bf16:
                             losses within 2e-2 relative (AUTOCAST_TOL), gradient norms within
                             5e-2, no weight comparison.

The reference is transformers' GPT2LMHeadModel when it imports, else the plain-torch GPT-2
below (--reference or $ZOE_PARITY_REFERENCE forces one). It runs in float64, so what differs is zoe's fp32 rounding.
Exit 0: everything matches; 1: a mismatch (worst offenders printed); 2: bad input.
"""
import argparse
import importlib
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

TOL = 1e-4  # relative, for losses, gradient norms and every gradient tensor
# bf16 compute against autocast: both round each product's operands to bf16, but zoe also keeps
# bf16 LayerNorm weights, biases and embeddings (its weights are bf16) and fp32 attention, and
# torch keeps bf16 linear outputs: the two differ at bf16's precision, not at fp32's.
AUTOCAST_TOL = 2e-2
# Gradient norms drift further apart than losses (2e-2 seen by step 6): autocast's gradients flow
# through bf16 activations, zoe's through fp32 ones and are rounded to bf16 once, at the end.
AUTOCAST_NORM_TOL = 5e-2
ST_DTYPES = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "U8": "u1"}


def read_safetensors(path):
    """{name: tensor}, metadata. Only the dtypes zoe writes here."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        dt = np.dtype(ST_DTYPES[info["dtype"]])
        b, e = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dt, count=(e - b) // dt.itemsize, offset=8 + n + b)
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out, meta


# ---- plain-torch GPT-2: HF's module names and Conv1D layout (weight [in, out]) ----

class Conv1D(torch.nn.Module):
    def __init__(self, nin, nout):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(nin, nout))
        self.bias = torch.nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(torch.nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.c_attn, self.c_proj = Conv1D(C, 3 * C), Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.nh)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class Mlp(torch.nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(C, 4 * C), Conv1D(4 * C, C)

    def forward(self, x):
        h = self.c_fc(x)
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        return self.c_proj(h)


class Block(torch.nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5), torch.nn.LayerNorm(C, eps=1e-5)
        self.attn, self.mlp = Attention(C, nh), Mlp(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGpt2(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        C = s["n_embd"]
        self.wte = torch.nn.Embedding(s["vocab_size"], C)
        self.wpe = torch.nn.Embedding(s["n_positions"], C)
        self.h = torch.nn.ModuleList(Block(C, s["n_head"]) for _ in range(s["n_layer"]))
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.T  # tied LM head


# ---- the reference: a module whose named_parameters() are the HF names, and logits(idx) ----

def hf_config(s):
    from transformers import GPT2Config
    return GPT2Config(n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"],
                      vocab_size=s["vocab_size"], n_positions=s["n_positions"],
                      activation_function="gelu_new", layer_norm_epsilon=1e-5,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


class Reference:
    def __init__(self, kind, s, state, autocast=False):
        """kind: "transformers" or "torch"; state: HF names -> tensors, loaded strictly.
        float64, or with autocast fp32 run under torch.autocast("cpu", bfloat16)."""
        self.kind, self.autocast = kind, autocast
        if kind == "transformers":
            from transformers import GPT2LMHeadModel
            self.lm = GPT2LMHeadModel(hf_config(s)).eval()
            self.body = self.lm.transformer
        else:
            self.lm = TorchGpt2(s)
            self.body = self.lm
        self.lm = self.lm.float() if autocast else self.lm.double()
        self.body.load_state_dict({k: v.to(torch.float32 if autocast else torch.float64) for k, v in state.items()},
                                  strict=True)
        if kind == "transformers":
            assert self.lm.lm_head.weight is self.lm.transformer.wte.weight, "LM head not tied"

    def logits(self, idx):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            out = self.lm(idx.long())
        out = out.logits if self.kind == "transformers" else out
        return out.float() if self.autocast else out  # the loss in fp32, as autocast does

    def params(self):
        return dict(self.body.named_parameters())

    def loss(self, inputs, targets):
        """Mean cross-entropy over all tokens; targets given explicitly (no internal shift)."""
        lg = self.logits(inputs)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.reshape(-1).long())


def pick_reference(want):
    if want in ("auto", "transformers"):
        try:
            importlib.import_module("transformers").GPT2LMHeadModel  # the lazy import happens here
            return "transformers"
        except Exception as e:  # any import failure means: not usable here
            if want == "transformers":
                sys.exit(f"transformers requested but not importable: {e}")
            print(f"note: transformers not importable ({type(e).__name__}: {e}); using plain torch")
    return "torch"


def describe(kind):
    if kind == "transformers":
        import transformers
        return f"transformers {transformers.__version__} GPT2LMHeadModel, torch {torch.__version__}"
    return f"plain-torch GPT-2 in this script, torch {torch.__version__}"


# ---- comparisons ----

def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def tensor_errors(got, ref):
    """(norm-relative error, elementwise error with a floor of 1% of the tensor's max |ref|)."""
    got, ref = got.double(), ref.double()
    err = (got - ref).abs()
    norm_rel = (err.norm() / ref.norm().clamp_min(1e-30)).item()
    floor = 1e-2 * ref.abs().max().clamp_min(1e-30)
    elem = (err / (ref.abs() + floor)).max().item()
    return norm_rel, elem


def check_tensors(what, got, ref, elem_tol=TOL):
    """Prints the worst tensors; returns whether all are within TOL norm-relative and elem_tol
    elementwise."""
    rows = []
    for name in ref:
        if name not in got:
            print(f"FAIL {what}: zoe has no '{name}'")
            return False
        if tuple(got[name].shape) != tuple(ref[name].shape):
            print(f"FAIL {what} '{name}': shape {tuple(got[name].shape)} vs {tuple(ref[name].shape)}")
            return False
        rows.append((name, *tensor_errors(got[name], ref[name])))
    rows.sort(key=lambda r: -max(r[1], r[2]))
    print(f"{what}: {len(rows)} tensors; worst norm-relative {max(r[1] for r in rows):.3e}, "
          f"worst elementwise (floor 1% of max) {max(r[2] for r in rows):.3e}")
    for name, nr, el in rows[:5]:
        print(f"  {name:32s} norm-rel {nr:.3e}  elementwise {el:.3e}")
    bad = [r for r in rows if r[1] > TOL or r[2] > elem_tol]
    for name, nr, el in bad:
        print(f"FAIL {what} '{name}': norm-rel {nr:.3e} (limit {TOL:g}), elementwise {el:.3e} (limit {elem_tol:g})")
    return not bad


# ---- mode grads ----

def shape_from(meta):
    return {k: int(meta[k]) for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")}


def loss_and_grads(ref, inputs, targets):
    loss = ref.loss(inputs, targets)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in ref.params().items()}


def run_grads(d, kind):
    weights, _ = read_safetensors(os.path.join(d, "weights.safetensors"))
    z, meta = read_safetensors(os.path.join(d, "zoe.safetensors"))
    s = shape_from(meta)
    inputs, targets = z["inputs"], z["targets"]
    ref = Reference(kind, s, weights)
    loss, grads = loss_and_grads(ref, inputs, targets)
    zl = float(meta["loss"])
    print(f"loss: zoe {zl:.9f}  reference {loss:.9f}  relative error {rel(zl, loss):.3e}")
    ok = rel(zl, loss) <= TOL
    zg = {k[len("grad."):]: v for k, v in z.items() if k.startswith("grad.")}
    ok = check_tensors("gradients", zg, grads) and ok
    if set(zg) != set(grads):
        print(f"FAIL: zoe's gradients {sorted(set(zg) - set(grads))} have no reference tensor")
        ok = False
    if kind == "transformers":  # the fallback reference must agree with transformers too
        plain_loss, plain_grads = loss_and_grads(Reference("torch", s, weights), inputs, targets)
        worst = max(tensor_errors(plain_grads[n], grads[n])[0] for n in grads)
        print(f"plain-torch reference vs transformers: loss {rel(plain_loss, loss):.1e}, "
              f"gradients norm-relative {worst:.1e}")
        ok = ok and rel(plain_loss, loss) <= 1e-10 and worst <= 1e-10
    return ok


# ---- mode train ----

class LlmcBatches:
    """The global batches of contracts.md's llm.c order: rank r reads B*T+1 tokens at
    position + r*B*T; position advances by N*B*T, back to 0 when a batch would run past the end."""

    def __init__(self, tokens, B, T, N):
        self.tokens, self.B, self.T, self.N, self.pos = tokens, B, T, N, 0

    def next(self):
        B, T, N = self.B, self.T, self.N
        if self.pos + N * B * T + 1 > len(self.tokens):
            self.pos = 0
        xs, ys = [], []
        for r in range(N):
            chunk = self.tokens[self.pos + r * B * T: self.pos + (r + 1) * B * T + 1]
            xs.append(chunk[:-1].reshape(B, T))
            ys.append(chunk[1:].reshape(B, T))
        self.pos += N * B * T
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


def read_report(path):
    steps, done = [], None
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "step" in j:
                steps.append(j)
            elif j.get("done"):
                done = j
    return steps, done


def adamw(ref, cfg):
    """torch.optim.AdamW with the config's hyperparameters and zoe's rule: weight decay on
    tensors of 2+ dims only."""
    o = cfg["optimizer"]["params"]
    ps = ref.params().values()
    groups = [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": o["weight_decay"]},
              {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])


def split_key_bias(params, s):
    """The key bias (c_attn.bias[C:2C]) gets a gradient of exactly 0 in exact arithmetic (softmax
    ignores a shift common to a query's scores), so under Adam it follows rounding noise: fp32's
    in zoe, float64's here. It is taken out of the 1e-4 comparison as "<name>[key]" and checked
    apart; the query and value biases stay as "<name>[query,value]"."""
    out, C = {}, s["n_embd"]
    for n, p in params.items():
        p = p.detach()
        if n.endswith("attn.c_attn.bias"):
            out[n + "[query,value]"] = torch.cat([p[:C], p[2 * C:]])
            out[n + "[key]"] = p[C:2 * C]
        else:
            out[n] = p
    return out


def check_key_bias(got, want, limit=1e-4):
    """The noise-driven key biases stay tiny on both sides (the others move by ~1e-2)."""
    keys = [n for n in want if n.endswith("[key]")]
    worst = max(max(got[n].abs().max().item(), want[n].abs().max().item()) for n in keys)
    print(f"key biases (gradient 0 in exact arithmetic): largest |value| {worst:.2e}, limit {limit:g}")
    return worst <= limit


def load_export(kind, s, path):
    """zoe export's file as a user would load it: transformers' from_pretrained (no missing,
    unexpected or mismatched keys), or a strict load_state_dict into the plain-torch model."""
    weights, meta = read_safetensors(path)
    if kind != "transformers":
        return Reference("torch", s, weights)
    from transformers import GPT2LMHeadModel
    with tempfile.TemporaryDirectory() as tmp:
        hf_config(s).save_pretrained(tmp)
        os.symlink(os.path.abspath(path), os.path.join(tmp, "model.safetensors"))
        lm, info = GPT2LMHeadModel.from_pretrained(tmp, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"FAIL: from_pretrained({path}) reported {problems}")
    print(f"export: GPT2LMHeadModel.from_pretrained loaded {len(weights)} tensors, no missing, "
          f"unexpected or mismatched keys (metadata format={meta.get('format')})")
    ref = Reference("transformers", s, {n: p.detach() for n, p in lm.transformer.named_parameters()})
    return ref


def run_train(d, kind):
    with open(os.path.join(d, "run.json")) as f:
        run = json.load(f)
    with open(os.path.join(d, run["config"])) as f:
        cfg = json.load(f)
    z = cfg["zoe"]
    assert cfg["gradient_clipping"] == 0 and cfg.get("scheduler") is None and z["data"]["format"] == "bytes"
    assert z["data"]["val"] == z["data"]["train"] and cfg["gradient_accumulation_steps"] == 1
    s = {k: v for k, v in z["model"].items() if k != "type"}
    B, T, N, steps = cfg["train_micro_batch_size_per_gpu"], z["data"]["seq_len"], run["ranks"], z["steps"]
    autocast = run.get("autocast") == "bf16"
    if autocast:
        assert cfg["bf16"]["enabled"] and z["compute_dtype"] == "bf16", "autocast parity is for bf16 compute"
    tol, norm_tol = (AUTOCAST_TOL, AUTOCAST_NORM_TOL) if autocast else (TOL, TOL)
    init, _ = read_safetensors(os.path.join(d, run["init"]))
    ref = Reference(kind, s, {k.removeprefix("transformer."): v for k, v in init.items()}, autocast)
    opt = adamw(ref, cfg)
    tokens = np.fromfile(z["data"]["train"], dtype=np.uint8).astype(np.int64)
    batches = LlmcBatches(tokens, B, T, N)
    report, done = read_report(os.path.join(d, run["report"]))
    if len(report) != steps or done is None:
        print(f"FAIL: report has {len(report)} step lines (want {steps}), done line: {done}")
        return False
    ok = True
    if autocast and done.get("compute_dtype") != "bf16":
        print(f"FAIL: the report's done line says compute_dtype {done.get('compute_dtype')!r}, not 'bf16'")
        ok = False
    print(f"{'step':>4} {'zoe loss':>12} {'torch loss':>12} {'rel err':>9} {'grad_norm rel':>13}")
    for k in range(steps):
        x, y = batches.next()
        opt.zero_grad()
        loss = ref.loss(x, y)
        loss.backward()
        gnorm = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in ref.params().values()))
        opt.step()
        zl, zn = report[k]["loss"], report[k]["grad_norm"]
        e_loss, e_norm = rel(zl, loss.item()), rel(zn, gnorm)
        print(f"{k + 1:4d} {zl:12.7f} {loss.item():12.7f} {e_loss:9.2e} {e_norm:13.2e}")
        if e_loss > tol or e_norm > norm_tol:
            print(f"FAIL step {k + 1}: loss differs by more than {tol:g} or grad_norm by more than {norm_tol:g}")
            ok = False
    if autocast:
        return ok
    # zoe's export: loads as a user would load it; its weights are torch's after training.
    exported = load_export(kind, s, os.path.join(d, run["export"]))
    got, want = split_key_bias(exported.params(), s), split_key_bias(ref.params(), s)
    # Adam divides by sqrt(v): ten steps turn fp32 rounding in small gradients into elementwise
    # differences near 1e-4 (6e-5 seen), so elementwise gets 1e-3 here; norm-relative keeps 1e-4.
    compared = {n: t for n, t in want.items() if not n.endswith("[key]")}
    ok = check_tensors("final weights (export vs torch)", got, compared, elem_tol=1e-3) and ok
    ok = check_key_bias(got, want) and ok
    # The last report line's val_loss (zoe's weights, in zoe) against the export's, in torch.
    val = LlmcBatches(tokens, B, T, N)
    with torch.no_grad():
        vl = sum(exported.loss(*val.next()).item() for _ in range(run["val_batches"])) / run["val_batches"]
    zv = report[-1]["val_loss"]
    print(f"val loss after step {steps}: zoe {zv:.9f}  export in torch {vl:.9f}  "
          f"relative error {rel(zv, vl):.3e}")
    return rel(zv, vl) <= TOL and ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["grads", "train"])
    ap.add_argument("dir")
    ap.add_argument("--reference", choices=["auto", "transformers", "torch"],
                    default=os.environ.get("ZOE_PARITY_REFERENCE", "auto"))
    a = ap.parse_args()
    torch.manual_seed(0)
    kind = pick_reference(a.reference)
    print(f"reference: {describe(kind)} (float64, or fp32 under bf16 autocast where run.json says so)")
    ok = run_grads(a.dir, kind) if a.mode == "grads" else run_train(a.dir, kind)
    print("PARITY OK" if ok else "PARITY FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the framework tests (hf_trainer.py, lightning_strategy.py, accelerate_loop.py) share.

The reference runs (plain torch in one process), kept between tests: the
record of a run depends only on the test file and the arguments, so tests that differ in zoe's
settings alone (stage, NVMe) share one. The cache is $ZOE_TEST_CACHE (ctest sets it under the
build folder); without it each test runs its own reference."""
import hashlib
import importlib.metadata
import os
import subprocess
import sys

import torch

T = 16  # the tiny GPT-2's positions and the samples' length


def tiny_gpt2(**config):
    """transformers' GPT2LMHeadModel, 2 layers of width 32, vocabulary 64, no dropout, seed 0."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=T, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, **config))


def dataset(n, seed=1):
    """n samples of T random tokens, each its own labels."""
    ids = torch.randint(0, 64, (n, T), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": ids[i], "labels": ids[i]} for i in range(n)]


def rel(got, want):
    return abs(got - want) / max(abs(want), 1e-12)


def weight_gaps(got, want):
    """(largest, largest but GPT-2's key bias) of each tensor's max |got - want| over want's largest
    magnitude; `want` holds nested lists (a reference record). The key bias (inside c_attn.bias)
    has a true gradient of zero: Adam turns both sides' rounding noise into steps there, so tests
    hold it to 1e-3 and every other tensor to 1e-5, as torch_parity.py does."""
    gaps = {}
    for k, g in got.items():
        w = torch.tensor(want[k])
        gaps[k] = ((g - w).abs().max() / (w.abs().max() + 1e-12)).item()
    others = [v for k, v in gaps.items() if not k.endswith("attn.c_attn.bias")]
    return max(gaps.values(), default=0.0), max(others, default=0.0)


def child_env():
    """The environment without mpirun's and torch.distributed's variables: a plain process."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "PMI_")) and k not in
            ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")}


def _versions():
    out = [sys.version]
    for dist in ("torch", "transformers", "accelerate", "pytorch-lightning"):
        try:
            out.append(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            out.append(None)
    return out


def reference(script, args, workdir):
    """The path of the reference record for `script` run with `args` (plus --reference PATH),
    running it in a child process unless the cache holds it. Written to a temporary name and
    renamed, so that tests running at once never read half a record."""
    cache = os.environ.get("ZOE_TEST_CACHE") or workdir
    os.makedirs(cache, exist_ok=True)
    key = hashlib.sha1(open(script, "rb").read() + repr(args).encode() + repr(_versions()).encode()).hexdigest()[:16]
    path = os.path.join(cache, f"{os.path.basename(script)}.{key}.json")
    if os.path.exists(path):
        return path
    tmp = f"{path}.{os.getpid()}.tmp"
    r = subprocess.run([sys.executable, script, "--reference", tmp, "--workdir", workdir] + args, env=child_env(),
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit(f"the reference run of {os.path.basename(script)} failed")
    os.replace(tmp, path)
    return path


def shared_reference(script, args, workdir):
    """The reference record (a dict) on every rank: rank 0 makes or finds it, the others wait."""
    import json
    import torch.distributed as dist
    if dist.get_rank() == 0:
        reference(script, args, workdir)
    dist.barrier()
    with open(reference(script, args, workdir)) as f:
        return json.load(f)


def report(failures, line):
    """Prints every rank's failures and, on rank 0, PASS or FAIL with `line`; ends the process
    group; returns the exit code."""
    import torch.distributed as dist
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, failures)
    bad = any(everyone)
    if dist.get_rank() == 0:
        for r, fs in enumerate(everyone):
            for f in fs:
                print(f"rank {r}: FAIL: {f}", flush=True)
        print(f"{'FAIL' if bad else 'PASS'}: {line}", flush=True)
    # Gloo's worker threads, left running into interpreter shutdown, can free a tensor there and
    # abort the process (torch 1.13, Python 3.11: "terminate called without an active exception"
    # after a PASS): the group goes first.
    dist.barrier()
    dist.destroy_process_group()
    return 1 if bad else 0

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
    """Prints every rank's failures and, on rank 0, PASS or FAIL with `line`; returns the exit code."""
    import torch.distributed as dist
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, failures)
    bad = any(everyone)
    if dist.get_rank() == 0:
        for r, fs in enumerate(everyone):
            for f in fs:
                print(f"rank {r}: FAIL: {f}", flush=True)
        print(f"{'FAIL' if bad else 'PASS'}: {line}", flush=True)
    return 1 if bad else 0

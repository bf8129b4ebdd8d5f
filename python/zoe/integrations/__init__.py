"""zoe where users already train: the pieces every framework integration shares, importable without
any framework (issue 45; the Trainer, Accelerate and Lightning glue builds on these).

    cfg = zoe.integrations.config_from(lr=5e-4, weight_decay=0.1, max_grad_norm=1.0, bf16=True,
                                       zoe_config={"zero_optimization": {"stage": 3}})
    engine = zoe.Engine(cfg)
    model = zoe.torch.wrap(model, engine)
    optimizer = zoe.integrations.ZoeOptimizer(engine, lr=5e-4)   # what the framework steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_decay)

A framework that drives an optimizer and a scheduler (and divides the loss for gradient
accumulation, stepping at the boundary) then trains with zoe underneath: `optimizer.step()` is one
zoe step at the lr the scheduler set, `zero_grad()` is zoe's business, and `state_dict()` keeps the
schedule's state so that a resumed run continues it (the weights and Adam moments live in
`engine.save`'s checkpoints).
"""
import copy
import os

import torch

from .. import Error

__all__ = ["ZoeOptimizer", "config_from", "torch_distributed_env", "launch_env"]


class ZoeOptimizer(torch.optim.Optimizer):
    """A facade torch optimizer over a zoe engine. step() runs engine.step(lr) with
    param_groups[0]["lr"] (what the framework's scheduler set); zero_grad() does nothing (zoe
    takes each gradient as the backward hands it over and starts the next step from zero);
    state_dict() / load_state_dict() carry param_groups, so a scheduler resumed beside it sets the
    same lr. The result of the last step (applied, grad_norm before clipping, lr, step) is
    `last_step`; `grad_norm` is its grad_norm, for the frameworks' logs."""

    def __init__(self, engine, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        # torch.optim.Optimizer needs a parameter to hold the groups; zoe holds the real ones.
        self._placeholder = torch.nn.Parameter(torch.zeros(0), requires_grad=False)
        super().__init__([self._placeholder], {"lr": lr, "betas": tuple(betas), "eps": eps,
                                               "weight_decay": weight_decay})
        self.engine = engine
        self.last_step = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_step = self.engine.step(lr=self.param_groups[0]["lr"])
        return loss

    def zero_grad(self, set_to_none=True):
        """zoe's gradients are handed over by the backward and cleared by each step: nothing to do."""

    @property
    def grad_norm(self):
        return None if self.last_step is None else self.last_step["grad_norm"]


# What the framework's arguments set, as zoe config paths.
def _framework_values(lr, betas, eps, weight_decay, max_grad_norm, bf16, fp16, device):
    where = torch.device(device) if device is not None else None
    gpu = {("zoe", "device"): "cuda"} if where is not None and where.type == "cuda" else {}
    if gpu and where.index is not None:  # the framework's GPU is zoe's (else the local rank's)
        gpu[("zoe", "gpu")] = where.index
    return {**gpu,
        ("optimizer", "type"): "AdamW",
        ("optimizer", "params", "lr"): lr,
        ("optimizer", "params", "betas"): list(betas),
        ("optimizer", "params", "eps"): eps,
        ("optimizer", "params", "weight_decay"): weight_decay,
        ("gradient_clipping",): max_grad_norm,
        ("bf16", "enabled"): bool(bf16),
        ("fp16", "enabled"): bool(fp16),
        # The framework divides the loss and steps at the accumulation boundary: one zoe step each.
        ("gradient_accumulation_steps",): 1,
    }


def _get(d, path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None, False
        d = d[k]
    return d, True


def _set(d, path, value):
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def _same(a, b):
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def config_from(*, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_grad_norm=0.0, bf16=False,
                fp16=False, zoe_config=None, device=None):
    """zoe's config from a framework's training arguments (AdamW, clipping by global norm, bf16
    or fp16, the device it computes on) and `zoe_config`, a dict of zoe's keys (zero_optimization,
    zoe.*, ...). A key given in both must agree, or zoe.Error names it and both values; "auto" in
    zoe_config takes the framework's value, as DeepSpeed's config does. A framework on a GPU
    (`device` cuda) makes zoe.device "cuda": the weights zoe hands out are then GPU memory, where
    the framework's kernels run, on its GPU (cuda:N sets zoe.gpu N; on the CPU zoe.device stays
    zoe_config's, "cpu" by default). The framework does gradient accumulation, so
    gradient_accumulation_steps is 1 (another value in zoe_config is an error)."""
    if bf16 and fp16:
        raise Error("config_from: bf16 and fp16 are both set")
    cfg = copy.deepcopy(zoe_config or {})
    if not isinstance(cfg, dict):
        raise Error(f"config_from: zoe_config must be a dict of zoe's config keys, not {type(cfg).__name__}")
    if device is not None and torch.device(device).type == "cpu" and _get(cfg, ("zoe", "device"))[0] == "cuda":
        raise Error("config_from: 'zoe.device' is 'cuda' in zoe_config but the framework computes on the CPU: "
                    "its inputs would meet weights in GPU memory; give the framework the GPU too")
    for path, value in _framework_values(lr, betas, eps, weight_decay, max_grad_norm, bf16, fp16, device).items():
        given, present = _get(cfg, path)
        if present and given != "auto" and not _same(given, value):
            name = ".".join(path)
            raise Error(f"config_from: '{name}' is {given!r} in zoe_config but {value!r} from the framework's "
                        "arguments; give it in one place (or \"auto\" in zoe_config)")
        _set(cfg, path, value)
    return cfg


def _port(env):
    """A port per mpirun job: its job family (the upper 16 bits of Open MPI's job id, the same on
    every rank of one job, different between jobs started apart) picks one in 20000-31999."""
    jobid = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE") or ""
    return str(20000 + (int(jobid) >> 16) % 12000) if jobid.isdigit() else "29500"


def torch_distributed_env(environ=None):
    """Under mpirun (Open MPI), sets what torch.distributed's env:// init reads and the frameworks
    look for, from Open MPI's own variables, where not set already: RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_PORT (20000 + the mpirun job's family number mod 12000, so that two
    jobs on one node do not both take torchrun's 29500) and, when every rank runs on this node, MASTER_ADDR
    (127.0.0.1). Across nodes MASTER_ADDR must name rank 0's host (zoe.Error otherwise). Returns
    the variables set. Without mpirun it does nothing; a launcher's WORLD_SIZE > 1 without MPI is
    refused by zoe.Engine."""
    env = os.environ if environ is None else environ
    if "OMPI_COMM_WORLD_SIZE" not in env:
        return {}
    mpi = {"RANK": env["OMPI_COMM_WORLD_RANK"], "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
           "LOCAL_RANK": env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
           "LOCAL_WORLD_SIZE": env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"), "MASTER_PORT": _port(env)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if key in env and env[key] != mpi[key]:
            raise Error(f"torch_distributed_env: {key}={env[key]} but Open MPI says {mpi[key]}")
    if mpi["LOCAL_WORLD_SIZE"] == mpi["WORLD_SIZE"]:
        mpi["MASTER_ADDR"] = "127.0.0.1"
    elif "MASTER_ADDR" not in env:
        raise Error(f"torch_distributed_env: {mpi['WORLD_SIZE']} ranks over several nodes: set MASTER_ADDR to rank "
                    "0's host name (mpirun -x MASTER_ADDR=...) for torch.distributed")
    added = {k: v for k, v in mpi.items() if k not in env}
    env.update(added)
    return added


def launch_env(environ=None):
    """What zoe.integrations.hf, .accelerate and .lightning run when imported, before the framework
    starts torch.distributed: torch_distributed_env() under mpirun; under a launcher that sets
    WORLD_SIZE > 1 without MPI (torchrun, accelerate launch), zoe.Error saying how to launch, as
    the framework would otherwise wait for peers zoe never joins."""
    env = os.environ if environ is None else environ
    if "OMPI_COMM_WORLD_SIZE" not in env and int(env.get("WORLD_SIZE", "1") or "1") > 1:
        raise Error(f"zoe: WORLD_SIZE={env['WORLD_SIZE']} without MPI (torchrun or accelerate launch?): zoe's ranks are "
                    "MPI processes; launch with `mpirun -np N python3 script.py`")
    return torch_distributed_env(env)

"""PyTorch Lightning on zoe: a Strategy, registered under DeepSpeed's names with zoe's prefix.

    import zoe.integrations.lightning            # first: under mpirun it sets RANK, WORLD_SIZE, ...
    trainer = pl.Trainer(strategy="zoe_stage_3", accelerator="cpu", devices=2, precision="bf16-mixed",
                         gradient_clip_val=1.0, accumulate_grad_batches=2, max_steps=1000)
    # or strategy=zoe.integrations.lightning.ZoeStrategy(zoe_config={...}) for zoe's own keys

Launch with `mpirun -np N python3 train.py` (devices=N on one node). Names: zoe_stage_{0,1,2,3},
zoe_stage_2_offload (optimizer state in host memory), zoe_stage_3_offload (and the parameters),
zoe_stage_3_offload_nvme (both on NVMe under ZoeStrategy(nvme_path=...) or $ZOE_NVME_PATH).

The LightningModule keeps its configure_optimizers: its optimizer (Adam or AdamW, one lr for all
groups) gives zoe lr, betas, eps and weight decay (decayed: the parameters of its groups with
weight_decay > 0), and its scheduler keeps setting the lr, which each zoe step reads from the
optimizer's first group; the optimizer itself holds no state (its parameters are zoe's).
gradient_clip_val (algorithm "norm") is zoe's clipping; accumulate_grad_batches is Lightning's
(it divides the loss; zoe steps at the boundary). precision "bf16-mixed" or "bf16-true" trains bf16
weights with fp32 masters (ZoePrecision), "32-true" fp32.

Checkpoints are directories, as DeepSpeed's are under Lightning: `<name>.ckpt/zoe/` (zoe's
checkpoint: fp32 masters, Adam moments, step) and `<name>.ckpt/lightning.pt` (loops, callbacks, the
optimizer's param_groups, the scheduler), written collectively; `ckpt_path=` resumes on any
number of ranks. `strategy.export(path)` writes the weights as one safetensors file (collective).
`strategy.grad_norm` is the last step's global norm before clipping. validate()/test() after
fit() use the trained engine (until strategy.close_engine()); fit() after them on the same strategy
raises zoe.Error (the engine took its optimizer settings, none then, at the first setup).
"""
import os
import shutil

import pytorch_lightning as pl
import torch
from pytorch_lightning.plugins.precision import Precision
from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry

import zoe
import zoe.torch

from . import config_from, launch_env

__all__ = ["ZoeStrategy", "ZoePrecision"]

CHECKPOINT_SUBDIR = "zoe"
STATE_NAME = "lightning.pt"

launch_env()  # before the Trainer reads the ranks from the environment


def _sharded_tensor_importable():
    try:
        import torch.distributed._shard.sharded_tensor  # noqa: F401
        return True
    except (ImportError, ValueError):
        return False


# torch 1.13's torch.distributed._shard does not import on Python 3.11 (a dataclass with a mutable
# default: Debian's python3-torch), and LightningModule.__init__ imports it to register
# ShardedTensor hooks, so no module could even be made. zoe has no ShardedTensor: skip them there.
if not _sharded_tensor_importable():
    pl.LightningModule._register_sharded_tensor_state_dict_hooks_if_available = lambda self: None


class ZoePrecision(Precision):
    """bf16 weights (zoe keeps the fp32 masters), or fp32: the module and float inputs converted."""

    def __init__(self, precision="32-true"):
        if precision not in ("32-true", "32", "bf16-mixed", "bf16-true", "bf16"):
            raise zoe.Error(f"ZoeStrategy: precision {precision!r} is not supported (use '32-true' or 'bf16-mixed'; "
                            "fp16 needs zoe's loss scaling, which Lightning's GradScaler would duplicate)")
        self.precision = precision
        self.dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float32

    def convert_module(self, module):
        return module.to(self.dtype)

    def convert_input(self, data):
        from lightning_fabric.utilities.apply_func import apply_to_collection
        return apply_to_collection(data, torch.Tensor, lambda t: t.to(self.dtype) if t.is_floating_point() else t)


class ZoeStrategy(DDPStrategy):
    strategy_name = "zoe"

    def __init__(self, zoe_config=None, stage=None, offload=None, nvme_path=None, **kwargs):
        """zoe_config: zoe's own keys (zero_optimization, zoe.*); stage / offload ("cpu", "nvme")
        / nvme_path: the registered names' settings (a zoe_config key wins if both are given
        and agree; disagreeing is zoe.Error)."""
        kwargs.setdefault("process_group_backend", "gloo")
        super().__init__(**kwargs)
        self.zoe_config = _with_stage(zoe_config, stage, offload, nvme_path)
        self.engine = None
        self._configured_for_fit = False
        self.grad_norm = None

    @property
    def restore_checkpoint_after_setup(self):
        return True  # zoe's checkpoint loads into the engine that setup() makes

    @classmethod
    def register_strategies(cls, registry):
        names = [("zoe_stage_0", 0, None), ("zoe_stage_1", 1, None), ("zoe_stage_2", 2, None),
                 ("zoe_stage_3", 3, None), ("zoe_stage_2_offload", 2, "cpu"), ("zoe_stage_3_offload", 3, "cpu"),
                 ("zoe_stage_3_offload_nvme", 3, "nvme")]
        for name, stage, offload in names:
            registry.register(name, cls, description=f"zoe ZeRO stage {stage}{', offload ' + offload if offload else ''}",
                              stage=stage, offload=offload, override=True)

    # --- setup: zoe wraps the module instead of DDP ---
    def setup(self, trainer):
        self.accelerator.setup(trainer)
        if not isinstance(self.precision_plugin, ZoePrecision):
            self.precision_plugin = ZoePrecision(str(getattr(self.precision_plugin, "precision", "32-true")))
        fitting = trainer.state.fn == pl.trainer.states.TrainerFn.FITTING
        if fitting:
            self.setup_optimizers(trainer)
        if self.engine is None:
            self._wrap(trainer)
        elif fitting and not self._configured_for_fit:
            raise zoe.Error("ZoeStrategy: fit() after validate()/test()/predict() on the same strategy: zoe took "
                            "its optimizer settings (none then) when it first wrapped the module; give fit() a new "
                            "ZoeStrategy, or fit first")
        self.setup_precision_plugin()

    def _wrap(self, trainer):
        module = self.lightning_module
        opt = self.optimizers[0] if self.optimizers else None
        hyper, decayed = _adam_settings(opt, len(self.optimizers))
        clip = 0.0
        if trainer.gradient_clip_val:
            if trainer.gradient_clip_algorithm not in (None, "norm"):
                raise zoe.Error(f"ZoeStrategy: gradient_clip_algorithm {trainer.gradient_clip_algorithm!r}: zoe clips "
                                "by the global norm only ('norm')")
            clip = float(trainer.gradient_clip_val)
        bf16 = self.precision_plugin.dtype == torch.bfloat16
        cfg = config_from(max_grad_norm=clip, bf16=bf16, zoe_config=self.zoe_config, device=self.root_device,
                          **hyper)
        self.precision_plugin.convert_module(module)
        engine = zoe.Engine(cfg)
        if engine.world_size != self.world_size:
            engine.close()
            raise zoe.Error(f"ZoeStrategy: zoe runs {engine.world_size} ranks but Lightning {self.world_size}: launch "
                            "with mpirun -np N, devices=N, and import zoe.integrations.lightning first")
        zoe.torch.wrap(module, engine, decay=lambda name, p: id(p) in decayed)
        self.engine = engine
        self._configured_for_fit = opt is not None
        self.model = module

    def model_to_device(self):
        """zoe places the parameters."""

    def teardown(self):
        """Lightning's, less moving the module to the CPU: its parameters are zoe's (a .cpu() would
        fetch every unit, and on a GPU leave host copies of them in the module), and validate(),
        test() or predict() after fit() run where zoe placed it."""
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        # The precision plugin runs the closure (forward, backward: zoe takes the gradients) and
        # the module's optimizer, which finds no gradients; then zoe steps at the optimizer's lr.
        out = self.precision_plugin.optimizer_step(optimizer, model=model or self.lightning_module, closure=closure,
                                                   **kwargs)
        result = self.engine.step(lr=optimizer.param_groups[0]["lr"])
        self.grad_norm = result["grad_norm"]
        return out

    def export(self, path):
        """The weights as one safetensors file (rank 0 writes; every rank calls it)."""
        self.engine.export(os.fspath(path))

    # --- checkpoints: a directory per checkpoint ---
    def lightning_module_state_dict(self):
        return {}  # the weights are in zoe's checkpoint

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        filepath = self.broadcast(os.fspath(filepath))
        self.engine.save(os.path.join(filepath, CHECKPOINT_SUBDIR))  # collective; makes the directory
        if self.is_global_zero:
            kept = {k: v for k, v in checkpoint.items() if k != "state_dict"}
            torch.save(kept, os.path.join(filepath, STATE_NAME))
        self.barrier("zoe_save_checkpoint")

    def load_checkpoint(self, checkpoint_path):
        path = os.fspath(checkpoint_path)
        if not os.path.isdir(os.path.join(path, CHECKPOINT_SUBDIR)):
            raise zoe.Error(f"ZoeStrategy: {path} is not a zoe checkpoint (a directory with '{CHECKPOINT_SUBDIR}/' and "
                            f"'{STATE_NAME}' that ZoeStrategy saved)")
        if self.engine is None:
            raise zoe.Error("ZoeStrategy: load_checkpoint before setup")
        self.engine.load(os.path.join(path, CHECKPOINT_SUBDIR))
        return torch.load(os.path.join(path, STATE_NAME), map_location="cpu")

    def load_model_state_dict(self, checkpoint, strict=True):
        """Loaded with zoe's checkpoint."""

    def remove_checkpoint(self, filepath):
        if self.is_global_zero:
            shutil.rmtree(os.fspath(filepath), ignore_errors=True)

    def close_engine(self):
        """The engine outlives fit() (teardown leaves it) so that validate()/test()/predict() after it
        use the trained weights; this closes it (as exit does)."""
        if self.engine is not None:
            self.engine.close()


def _with_stage(zoe_config, stage, offload, nvme_path):
    cfg = dict(zoe_config or {})
    zo = dict(cfg.get("zero_optimization", {}))
    if stage is not None:
        if zo.get("stage", stage) != stage:
            raise zoe.Error(f"ZoeStrategy: stage {stage} but zoe_config's zero_optimization.stage is {zo['stage']}")
        zo["stage"] = stage
    if offload is not None:
        path = nvme_path or os.environ.get("ZOE_NVME_PATH")
        if offload == "nvme" and not path:
            raise zoe.Error("ZoeStrategy: NVMe offload needs a directory: ZoeStrategy(nvme_path=...) or $ZOE_NVME_PATH")
        tier = {"device": offload} if offload == "cpu" else {"device": "nvme", "nvme_path": path}
        zo.setdefault("offload_optimizer", tier)
        if stage == 3:
            zo.setdefault("offload_param", dict(tier))
    cfg["zero_optimization"] = zo
    return cfg


def _adam_settings(opt, count):
    """config_from's arguments from the module's optimizer, and the ids of the decayed parameters."""
    if opt is None:  # validate/test/predict without fit: zoe's defaults
        return {"lr": 0.0}, set()
    if count != 1 or type(opt).__name__ not in ("Adam", "AdamW"):
        raise zoe.Error(f"ZoeStrategy: configure_optimizers must return one Adam or AdamW optimizer (zoe runs AdamW), "
                        f"not {count} x {type(opt).__name__}")
    groups = opt.param_groups
    first = groups[0]
    for g in groups[1:]:
        for key in ("lr", "betas", "eps"):
            if g[key] != first[key]:
                raise zoe.Error(f"ZoeStrategy: the optimizer's parameter groups differ in {key} ({first[key]} and "
                                f"{g[key]}); zoe takes one for all parameters (weight_decay may differ: 0 or one value)")
    decays = {g["weight_decay"] for g in groups if g["weight_decay"] > 0}
    if len(decays) > 1:
        raise zoe.Error(f"ZoeStrategy: weight decays {sorted(decays)}: zoe applies one value (or none) per parameter")
    if type(opt).__name__ == "Adam" and decays:
        raise zoe.Error("ZoeStrategy: torch.optim.Adam's weight_decay is L2 in the gradient; zoe runs AdamW's "
                        "decoupled decay: use torch.optim.AdamW")
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    return {"lr": first.get("initial_lr", first["lr"]), "betas": tuple(first["betas"]), "eps": first["eps"],
            "weight_decay": decays.pop() if decays else 0.0}, decayed


ZoeStrategy.register_strategies(StrategyRegistry)

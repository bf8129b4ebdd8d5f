"""zoe in a raw Accelerate loop. Accelerate has no backend plug-in (accelerate#2968), and its
prepare() would wrap the model in DDP over parameters zoe owns, so the model is wrapped by zoe and
not prepared; the rest goes through Accelerate as usual:

    import zoe.integrations.accelerate as za    # first: under mpirun it sets RANK, WORLD_SIZE, ...
    accelerator = Accelerator()
    engine = zoe.Engine(zoe.integrations.config_from(lr=1e-3, weight_decay=0.1, max_grad_norm=1.0,
                                                     zoe_config={"zero_optimization": {"stage": 3}},
                                                     device=accelerator.device))   # a GPU: zoe.device cuda
    model = zoe.torch.wrap(model, engine)
    optimizer = zoe.integrations.ZoeOptimizer(engine, lr=1e-3)
    model, optimizer, loader, scheduler = za.prepare(accelerator, model, optimizer, loader, scheduler)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)              # divides by the accumulation steps
            optimizer.step(); scheduler.step(); optimizer.zero_grad()

Launch with `mpirun -np N python3 train.py` (not `accelerate launch`: zoe's ranks are MPI's).
mixed_precision "fp16" is refused (its GradScaler and zoe's loss scale would both act): use "bf16".
Clipping is zoe's (`max_grad_norm` above): skip accelerator.clip_grad_norm_, which sees the empty
parameters. accelerator.save_state(dir) / load_state(dir) also save and load the engine's
checkpoint in dir/zoe (weights, Adam moments, step), on every rank, any rank count.

How Accelerate's scheduler counts: a scheduler prepared by Accelerate (split_batches False, the
default) advances num_processes steps at each optimizer step, as each process saw 1/N of the
batches; size the schedule in those units (num_training_steps * num_processes, as Accelerate's
examples do), or leave the scheduler out of prepare() to step it once per optimizer step. The
prepared optimizer steps only at the accumulation boundary (sync_gradients).
"""
import os

from .. import Error
from . import ZoeOptimizer, launch_env

__all__ = ["prepare", "CHECKPOINT_SUBDIR"]

CHECKPOINT_SUBDIR = "zoe"

launch_env()  # before Accelerator() starts torch.distributed


def prepare(accelerator, model, optimizer, *others):
    """Returns (model, prepared optimizer, *prepared others): the zoe-wrapped model as it is, the
    ZoeOptimizer and the rest (data loaders, schedulers) through accelerator.prepare; registers
    the save/load-state hooks that keep the engine's checkpoint beside Accelerate's state."""
    wrapper = getattr(model, "_zoe", None)
    if wrapper is None or not isinstance(optimizer, ZoeOptimizer):
        raise Error("zoe.integrations.accelerate.prepare(accelerator, model, optimizer, ...): model must be "
                    "zoe.torch.wrap'ped and optimizer a zoe.integrations.ZoeOptimizer over the same engine")
    if optimizer.engine is not wrapper.engine:
        raise Error("zoe.integrations.accelerate.prepare: the optimizer's engine is not the model's")
    if getattr(accelerator, "mixed_precision", "no") == "fp16" or getattr(accelerator, "scaler", None) is not None:
        raise Error("zoe.integrations.accelerate.prepare: Accelerator(mixed_precision=\"fp16\") is not supported (its "
                    "GradScaler would step a ZoeOptimizer that holds no gradients, and scale the loss zoe scales "
                    "itself); use \"bf16\" (zoe's config: bf16=True in config_from)")
    engine = wrapper.engine
    if engine.world_size != accelerator.num_processes:
        raise Error(f"zoe.integrations.accelerate.prepare: zoe runs {engine.world_size} ranks but Accelerate "
                    f"{accelerator.num_processes}: import zoe.integrations.accelerate before Accelerator()")
    prepared = accelerator.prepare(optimizer, *others)
    prepared = prepared if isinstance(prepared, tuple) else (prepared,)

    def save(models, weights, output_dir):
        engine.save(os.path.join(output_dir, CHECKPOINT_SUBDIR))

    def load(models, input_dir):
        engine.load(os.path.join(input_dir, CHECKPOINT_SUBDIR))

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)
    return (model,) + prepared

"""Hugging Face's Trainer on zoe: `ZoeTrainer` (and `ZoeSeq2SeqTrainer`) replace `Trainer` and
`TrainingArguments(deepspeed=...)`; the rest of a Trainer script stays as it is.

    import zoe.integrations.hf                  # first: under mpirun it sets RANK, WORLD_SIZE, ...
    args = TrainingArguments(output_dir="out", learning_rate=5e-4, weight_decay=0.1, ...)
    trainer = zoe.integrations.hf.ZoeTrainer(model=model, args=args, train_dataset=ds,
                                             zoe_config={"zero_optimization": {"stage": 3}})
    trainer.train()
    trainer.save_model()                        # collective: every rank calls it

Launch with `mpirun -np N python3 train.py`. Importing this module under mpirun sets what
torch.distributed reads (zoe.integrations.torch_distributed_env), so that the TrainingArguments
made after it see N ranks and the Trainer shards the data over zoe's ranks.

What the Trainer's arguments set goes to zoe (zoe.integrations.config_from): learning_rate,
adam_beta1/2, adam_epsilon, weight_decay (on the parameters the Trainer decays: not biases nor
LayerNorm weights), max_grad_norm, bf16. The Trainer's scheduler sets each step's lr; the Trainer
accumulates gradients (it divides the loss and steps at the boundary). zoe's own keys (stage,
offload, NVMe paths, ...) come from `zoe_config`.

Differences from the stock Trainer, each for a reason:
- the model is not prepared by Accelerate (its DDP would wrap parameters zoe owns); zoe reduces;
- `save_model` is collective and streams the weights into `model.safetensors` a unit at a time
  (rank 0 holds one unit, not the model), with `config.json` and the tokenizer: a folder
  `from_pretrained` loads. In bf16 the file holds the bf16 weights widened to fp32;
- checkpoints (`checkpoint-N/`) hold that export and zoe's checkpoint (`checkpoint-N/zoe/`: fp32
  masters, Adam moments, step) beside the Trainer's own files; `resume_from_checkpoint` loads it
  on any number of ranks;
- the logged `grad_norm` is zoe's (the global norm before clipping, as torch's clip_grad_norm_);
- `predict_with_generate` (ZoeSeq2SeqTrainer) generates inside `zoe.torch.gathered(model)`: one
  gather per prediction step, then each rank generates alone, whatever lengths the ranks reach;
- fp16 is refused (use bf16: zoe scales fp16 losses itself, and the Trainer's GradScaler would
  also scale them); `model_init` is refused (zoe wraps one model).
"""
import os

import torch
import transformers

import zoe
import zoe.torch

from . import ZoeOptimizer, config_from, launch_env

__all__ = ["ZoeTrainer", "ZoeSeq2SeqTrainer", "CHECKPOINT_SUBDIR"]

CHECKPOINT_SUBDIR = "zoe"  # zoe's checkpoint inside the Trainer's checkpoint-N folder
WEIGHTS_NAME = "model.safetensors"

# Before any TrainingArguments: they start torch.distributed from these variables.
launch_env()


def zoe_config_for(args, zoe_config):
    """zoe's config from a TrainingArguments and the user's zoe_config (see config_from)."""
    if args.fp16:
        raise zoe.Error("ZoeTrainer: fp16=True is not supported through the Trainer (its GradScaler and zoe's loss "
                        "scale would both scale the loss); use bf16=True")
    cfg = config_from(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                      weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm or 0.0, bf16=args.bf16,
                      zoe_config=zoe_config)
    cfg.setdefault("train_micro_batch_size_per_gpu", args.per_device_train_batch_size)
    return cfg


class _ZoeTrainerMixin:
    def __init__(self, model=None, args=None, *rest, zoe_config=None, **kwargs):
        if model is None or kwargs.get("model_init") is not None:
            raise zoe.Error("ZoeTrainer needs model= (model_init is not supported: zoe wraps one model)")
        if args is None:
            args = transformers.TrainingArguments(output_dir="tmp_trainer")
        if args.deepspeed or args.fsdp:
            raise zoe.Error("ZoeTrainer: TrainingArguments sets deepspeed or fsdp; zoe replaces them (remove it)")
        engine = zoe.Engine(zoe_config_for(args, zoe_config))
        if engine.world_size != args.world_size:
            engine.close()
            raise zoe.Error(f"ZoeTrainer: zoe runs {engine.world_size} ranks but the TrainingArguments see "
                            f"{args.world_size}: import zoe.integrations.hf before making the TrainingArguments")
        decayed = set(transformers.Trainer.get_decay_parameter_names(None, model))
        if args.bf16:
            model.to(torch.bfloat16)  # zoe trains bf16 weights (fp32 masters), as DeepSpeed's bf16 does
        zoe.torch.wrap(model, engine, decay=lambda name, p: name in decayed)
        self.zoe_engine = engine
        super().__init__(model, args, *rest, **kwargs)
        if self.optimizer is not None and not isinstance(self.optimizer, ZoeOptimizer):
            raise zoe.Error("ZoeTrainer: optimizers=(...) must hold a zoe.integrations.ZoeOptimizer (or None)")
        # Accelerate has no backend plug-in: leave the model to zoe, still preparing the rest.
        self.accelerator.prepare_model = _unprepared

    def _move_model_to_device(self, model, device):
        """zoe places the parameters."""

    def _wrap_model(self, model, training=True, dataloader=None):
        return model

    def create_optimizer(self):
        if self.optimizer is None:
            a = self.args
            self.optimizer = ZoeOptimizer(self.zoe_engine, lr=a.learning_rate, betas=(a.adam_beta1, a.adam_beta2),
                                          eps=a.adam_epsilon, weight_decay=a.weight_decay)
        return self.optimizer

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, *rest, **kwargs):
        # The Trainer's clip_grad_norm_ sees empty parameters (zoe holds the gradients): log zoe's.
        norm = self.optimizer.optimizer.grad_norm if hasattr(self.optimizer, "optimizer") else self.optimizer.grad_norm
        return super()._maybe_log_save_evaluate(tr_loss, norm if norm is not None else grad_norm, *rest, **kwargs)

    # --- saving: collective, streamed ---
    def save_model(self, output_dir=None, _internal_call=False):
        """Every rank calls it: the weights are gathered a unit at a time into
        <output_dir>/model.safetensors (written by rank 0), with config.json, the generation config,
        the tokenizer and training_args.bin beside it."""
        output_dir = output_dir or self.args.output_dir
        if self.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
        self.zoe_engine.export(os.path.join(output_dir, WEIGHTS_NAME))
        if self.args.should_save:
            model = self.accelerator.unwrap_model(self.model)
            if hasattr(model, "config"):
                model.config.architectures = [type(model).__name__]
                model.config.save_pretrained(output_dir)
            if getattr(model, "generation_config", None) is not None and model.can_generate():
                model.generation_config.save_pretrained(output_dir)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(output_dir)
            torch.save(self.args, os.path.join(output_dir, transformers.trainer.TRAINING_ARGS_NAME))
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save")

    def _save_optimizer_and_scheduler(self, output_dir):
        self.zoe_engine.save(os.path.join(output_dir, CHECKPOINT_SUBDIR))  # collective
        super()._save_optimizer_and_scheduler(output_dir)                 # param_groups, scheduler

    # --- loading: zoe's checkpoint holds the weights and the optimizer state ---
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if not os.path.isdir(os.path.join(resume_from_checkpoint, CHECKPOINT_SUBDIR)):
            raise zoe.Error(f"ZoeTrainer: {resume_from_checkpoint} holds no zoe checkpoint ('{CHECKPOINT_SUBDIR}/'); "
                            "resume from a checkpoint-N folder a ZoeTrainer saved (without save_only_model)")

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return
        self.zoe_engine.load(os.path.join(checkpoint, CHECKPOINT_SUBDIR))
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_best_model(self):
        best = self.state.best_model_checkpoint
        if os.path.isdir(os.path.join(best, CHECKPOINT_SUBDIR)):
            self.zoe_engine.load(os.path.join(best, CHECKPOINT_SUBDIR))
        else:  # save_only_model: the exported weights
            self.zoe_engine.load_safetensors(os.path.join(best, WEIGHTS_NAME))

    # --- prediction: generate after one gather ---
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        # generate() runs as many forwards as this rank's sequences need; at stage 3 each forward
        # would be a collective fetch, so gather once and let each rank finish on its own.
        if not gen_kwargs and hasattr(self, "_gen_kwargs"):  # what predict()/evaluate() were given
            gen_kwargs = self._gen_kwargs.copy()
        gen_kwargs["synced_gpus"] = False
        with zoe.torch.gathered(self.model):
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys,
                                           **gen_kwargs)


def _unprepared(model, device_placement=None, evaluation_mode=False):
    return model


class ZoeTrainer(_ZoeTrainerMixin, transformers.Trainer):
    """transformers.Trainer on zoe; takes zoe_config= (zoe's own keys) besides Trainer's arguments."""


class ZoeSeq2SeqTrainer(_ZoeTrainerMixin, transformers.Seq2SeqTrainer):
    """transformers.Seq2SeqTrainer on zoe (generation in prediction after one gather)."""

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
- `save_model` is collective and streams the weights into `model.safetensors` (shards and an index
  past `trainer.zoe_max_shard_bytes`, 5 GB) a unit at a time (rank 0 holds one unit, not the
  model), with `config.json` and the tokenizer: a folder `from_pretrained` loads;
- checkpoints (`checkpoint-N/`) hold that export and zoe's checkpoint (`checkpoint-N/zoe/`: fp32
  masters, Adam moments, step) beside the Trainer's own files; `resume_from_checkpoint` loads it
  on any number of ranks;
- the logged `grad_norm` is zoe's (the global norm before clipping, as torch's clip_grad_norm_);
- `predict_with_generate` (ZoeSeq2SeqTrainer) generates inside `zoe.torch.gathered(model)`: one
  gather per prediction step, then each rank generates alone, whatever lengths the ranks reach;
  `trainer.zoe_generate = "synced"` (a model too large to gather whole) uses transformers'
  `synced_gpus` instead: every forward fetches, and every rank runs forwards until all are done;
- fp16 is refused (use bf16: zoe scales fp16 losses itself, and the Trainer's GradScaler would
  also scale them); `model_init` is refused (zoe wraps one model).
"""
import json
import os
import struct

import torch
import transformers

import zoe
import zoe.torch

from . import ZoeOptimizer, config_from, launch_env

__all__ = ["ZoeTrainer", "ZoeSeq2SeqTrainer", "save_pretrained_weights", "CHECKPOINT_SUBDIR"]

CHECKPOINT_SUBDIR = "zoe"  # zoe's checkpoint inside the Trainer's checkpoint-N folder
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 10**9  # save_pretrained's default max_shard_size, "5GB"
_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}

# Before any TrainingArguments: they start torch.distributed from these variables.
launch_env()


def zoe_config_for(args, zoe_config):
    """zoe's config from a TrainingArguments and the user's zoe_config (see config_from)."""
    if args.fp16:
        raise zoe.Error("ZoeTrainer: fp16=True is not supported through the Trainer (its GradScaler and zoe's loss "
                        "scale would both scale the loss); use bf16=True")
    cfg = config_from(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                      weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm or 0.0, bf16=args.bf16,
                      zoe_config=zoe_config, device=args.device)
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
        self.zoe_max_shard_bytes = MAX_SHARD_BYTES
        self.zoe_generate = "gathered"  # or "synced": see prediction_step
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
        <output_dir>/model.safetensors (past zoe_max_shard_bytes, 5 GB by default as for
        save_pretrained: shards and model.safetensors.index.json), written by rank 0 in the
        weights' dtype, with config.json, the generation config, the tokenizer and
        training_args.bin beside it (save_pretrained_weights)."""
        output_dir = output_dir or self.args.output_dir
        save_pretrained_weights(self.model, output_dir, self.zoe_max_shard_bytes, writer=self.args.should_save)
        if self.args.should_save:
            model = self.accelerator.unwrap_model(self.model)
            if hasattr(model, "config"):
                model.config.architectures = [type(model).__name__]
                dtype = next((ps.dtype for u in model._zoe.units for ps in u.params), torch.float32)
                model.config.torch_dtype = str(dtype).split(".")[1]  # as save_pretrained records it
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
        else:
            raise zoe.Error(f"ZoeTrainer: load_best_model_at_end needs zoe's checkpoint in {best} "
                            f"('{CHECKPOINT_SUBDIR}/'), which save_only_model=True leaves out")

    # --- prediction: generate after one gather ---
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        # generate() runs as many forwards as this rank's sequences need; at stage 3 each forward
        # fetches collectively. "gathered": gather once, then each rank goes on alone. "synced"
        # (a model whose units do not all fit in gathered memory at once): transformers'
        # synced_gpus keeps every rank running forwards until all are done.
        if not gen_kwargs and hasattr(self, "_gen_kwargs"):  # what predict()/evaluate() were given
            gen_kwargs = self._gen_kwargs.copy()
        if self.zoe_generate == "synced":
            gen_kwargs["synced_gpus"] = self.zoe_engine.world_size > 1
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys,
                                           **gen_kwargs)
        gen_kwargs["synced_gpus"] = False
        with zoe.torch.gathered(self.model):
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys,
                                           **gen_kwargs)


def save_pretrained_weights(model, directory, max_shard_bytes=MAX_SHARD_BYTES, writer=True):
    """Writes a wrapped model's weights in Hugging Face's layout: `model.safetensors`, or past
    max_shard_bytes `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`.
    Collective (every rank calls it; rank 0 is the writer): units are gathered one at a time and
    each tensor's bytes go from the gathered buffer into its file (from a GPU through a host copy
    of that one tensor), so the writer holds one unit, not the model.
    Tied parameters are written once (under their first name, as save_pretrained keeps them);
    frozen parameters and persistent buffers (torch's, not zoe's) are written too. Each file is
    written under a temporary name and renamed; a failed write still gathers every unit (the
    other ranks wait on those fetches) and raises at the end. Returns the files written."""
    w = model._zoe
    plan = _weight_plan(model, w)
    shards = _shards(plan, max_shard_bytes)
    names = ([WEIGHTS_NAME] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    error = None
    files = []
    if writer:
        os.makedirs(directory, exist_ok=True)
    for shard, name in zip(shards, names):
        path = os.path.join(directory, name)
        tmp = f"{path}.tmp.{os.getpid()}"
        out = None
        try:
            if writer and error is None:
                out = open(tmp, "wb")
                _write_header(out, shard)
        except OSError as e:
            error = error or e
        for unit, entries in _by_unit(shard):
            if unit is not None:
                w.acquire(unit)  # collective at stage 3: every rank, whatever happened to the file
            try:
                for entry in entries:
                    if out is not None and error is None:
                        try:
                            out.write(_host_bytes(entry[2]))
                        except OSError as e:
                            error = e
            finally:
                if unit is not None:
                    w.release(unit)
        if out is not None:
            try:
                out.close()
                if error is None:
                    os.replace(tmp, path)
                    files.append(path)
            except OSError as e:
                error = error or e
            if error is not None and os.path.exists(tmp):
                os.unlink(tmp)
    if writer and error is None and len(shards) > 1:
        index = {"metadata": {"total_size": sum(e[3] for e in plan)},
                 "weight_map": {e[0]: n for shard, n in zip(shards, names) for e in shard}}
        tmp = os.path.join(directory, INDEX_NAME + f".tmp.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(index, f, indent=2)
        os.replace(tmp, os.path.join(directory, INDEX_NAME))
        files.append(os.path.join(directory, INDEX_NAME))
    if error is not None:
        raise zoe.Error(f"save_pretrained_weights: writing {directory}: {error}")
    return files


def _weight_plan(model, w):
    """(key, unit or None, tensor, bytes, dtype, shape) in the order they are written: zoe's parameters
    unit by unit, then torch's own tensors (frozen parameters, persistent buffers)."""
    plan, seen = [], set()
    for unit in w.units:
        for ps in unit.params:
            plan.append((ps.name, unit.index, ps.param, ps.numel * ps.param.element_size(), ps.dtype, ps.shape))
            seen.add(id(ps.param))
    for mname, mod in model.named_modules():
        tensors = [(n, p) for n, p in mod._parameters.items() if p is not None]
        tensors += [(n, b) for n, b in mod._buffers.items() if b is not None and n not in mod._non_persistent_buffers_set]
        for n, t in tensors:
            if id(t) in seen or t.dtype not in _ST_DTYPES:
                continue
            seen.add(id(t))
            plan.append((f"{mname}.{n}" if mname else n, None, t, t.numel() * t.element_size(), t.dtype, tuple(t.shape)))
    return plan


def _host_bytes(t):
    """t's bytes for the file: the gathered buffer itself on the CPU (no copy), a host copy of
    the one tensor from a GPU."""
    with zoe.torch._plain_ops():
        data = t.detach()
        data = data.cpu() if data.device.type != "cpu" else data
        return data.contiguous().view(torch.uint8).numpy()


def _shards(plan, max_bytes):
    shards, size = [[]], 0
    for e in plan:
        if shards[-1] and size + e[3] > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e[3]
    return shards


def _by_unit(shard):
    groups = []
    for e in shard:
        if groups and groups[-1][0] == e[1]:
            groups[-1][1].append(e)
        else:
            groups.append((e[1], [e]))
    return groups


def _write_header(out, shard):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for key, _, _, nbytes, dtype, shape in shard:
        header[key] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    out.write(struct.pack("<Q", len(text)) + text)


def _unprepared(model, device_placement=None, evaluation_mode=False):
    return model


class ZoeTrainer(_ZoeTrainerMixin, transformers.Trainer):
    """transformers.Trainer on zoe; takes zoe_config= (zoe's own keys) besides Trainer's arguments."""


class ZoeSeq2SeqTrainer(_ZoeTrainerMixin, transformers.Seq2SeqTrainer):
    """transformers.Seq2SeqTrainer on zoe (generation in prediction after one gather)."""

"""zoe.integrations.hf.ZoeTrainer against the stock Trainer running plain torch AdamW in one
process on the same global batch; under mpirun.

    mpirun -np 2 python3 hf_trainer.py --stage 3 [--accum 2] [--nvme DIR] [--bf16] [--resume]

A tiny GPT-2 (transformers' own GPT2LMHeadModel from a GPT2Config) trains 10 steps with warmup
then linear decay, weight decay (the Trainer's choice: not biases nor LayerNorm weights) and
clipping at 1.0. Rank 0 first runs the stock Trainer on the same global batch in a child process
(no MPI, no torch.distributed) and compares: each step's loss within 1e-5 relative (2e-2 with
--bf16, the reference under the Trainer's bf16 autocast), the logged grad_norm equal to zoe's and
within 1e-5 of torch's, the final weights within 1e-5, evaluate() within 1e-6. save_model's folder
loads with AutoModelForCausalLM.from_pretrained and gives the wrapped model's logits.

--resume: a checkpoint at step 5 resumes on these ranks, and in a child process on 1 rank with
twice the accumulation (same global batch), each giving the uninterrupted run's losses bit for bit.
Also (with --resume): ZoeSeq2SeqTrainer.predict with generation lengths that differ between ranks
completes after one gather, and `WORLD_SIZE=2` without mpirun is refused at import."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

import framework_common

A = None
WEIGHT_GAP = [0.0]
STEPS, B, LR, WD, CLIP = 10, 2, 5e-3, 0.1, 1.0
T = framework_common.T
failures = []


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--nvme")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--reference", help="(internal) run the stock Trainer, write its record to this file")
    ap.add_argument("--world", type=int, default=1, help="(internal) the ranks of the run the reference stands for")
    ap.add_argument("--resume-from", help="(internal) resume this checkpoint on 1 rank, write losses to --out")
    ap.add_argument("--out")
    ap.add_argument("--workdir")
    return ap.parse_args()


def tiny_gpt2():
    return framework_common.tiny_gpt2(pad_token_id=0)  # the pad generate() and Seq2Seq's padding use


dataset = framework_common.dataset
rel = framework_common.rel


def arguments(out, per_device, accum, bf16, **kw):
    from transformers import TrainingArguments
    return TrainingArguments(output_dir=out, per_device_train_batch_size=per_device, per_device_eval_batch_size=2,
                             gradient_accumulation_steps=accum, learning_rate=LR, weight_decay=WD,
                             max_grad_norm=CLIP, max_steps=STEPS, warmup_steps=3, lr_scheduler_type="linear",
                             logging_steps=1, save_strategy="steps", save_steps=5, report_to=[], seed=0,
                             bf16=bf16, use_cpu=True, disable_tqdm=True, dataloader_drop_last=True, **kw)


def recording(base):
    """A Trainer subclass that keeps each step's loss unrounded (the logs round to 4 digits) and
    reads the data in order (the same global batches whatever the rank count)."""
    class Recording(base):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.micro_losses = []

        def _get_train_sampler(self):
            return torch.utils.data.SequentialSampler(self.train_dataset)

        def training_step(self, model, inputs):
            loss = super().training_step(model, inputs)
            self.micro_losses.append(loss.item())  # already divided by the accumulation
            return loss
    return Recording


def step_losses(trainer, accum):
    m = trainer.micro_losses
    return [sum(m[i:i + accum]) for i in range(0, len(m), accum)]


def grad_norms(trainer):
    return [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]


def run_reference(a):
    """The stock Trainer, one process, the global batch of `a.world` ranks in one."""
    from transformers import Trainer
    model = tiny_gpt2()
    out = os.path.join(a.workdir, "reference")
    trainer = recording(Trainer)(model=model, args=arguments(out, B * a.world, a.accum, a.bf16),
                                 train_dataset=dataset(B * a.world * a.accum * STEPS))
    trainer.train()
    ev = trainer.evaluate(dataset(8, seed=2))
    weights = {k: v.float().tolist() for k, v in model.state_dict().items()}
    with open(a.reference, "w") as f:
        json.dump({"losses": step_losses(trainer, a.accum), "grad_norms": grad_norms(trainer),
                   "eval_loss": ev["eval_loss"], "weights": weights}, f)


def zoe_config(a):
    zo = {"stage": a.stage}
    if a.nvme:
        os.makedirs(a.nvme, exist_ok=True)
        zo["offload_optimizer"] = {"device": "nvme", "nvme_path": a.nvme}
        if a.stage == 3:
            zo["offload_param"] = {"device": "nvme", "nvme_path": a.nvme}
    return {"zero_optimization": zo}


def compare(a, rank, trainer, ref, model_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    tol = 2e-2 if a.bf16 else 1e-5
    losses = step_losses(trainer, a.accum)
    everyone = [None] * trainer.args.world_size
    torch.distributed.all_gather_object(everyone, losses)
    means = [sum(col) / len(col) for col in zip(*everyone)]
    worst = max(rel(g, w) for g, w in zip(means, ref["losses"]))
    if len(means) != STEPS or worst > tol:
        failures.append(f"per-step losses within {worst:.1e} of the stock Trainer's, not {tol} ({len(means)} steps)")
    logged, zoe_norms = grad_norms(trainer), trainer.zoe_norms
    if logged != zoe_norms:
        failures.append(f"logged grad_norm {logged[:3]}... is not zoe's {zoe_norms[:3]}...")
    worst_norm = max(rel(g, w) for g, w in zip(logged, ref["grad_norms"]))
    if worst_norm > (5e-2 if a.bf16 else 1e-5):
        failures.append(f"grad_norm within {worst_norm:.1e} of torch's")
    if a.bf16:
        return worst
    exported = load_file(os.path.join(model_dir, "model.safetensors")) if rank == 0 else {}
    worst_weight, gap = framework_common.weight_gaps(exported, ref["weights"])  # key bias to 1e-3 only
    WEIGHT_GAP[0] = gap
    if rank == 0 and (gap > 1e-5 or worst_weight > 1e-3 or "transformer.wte.weight" not in exported):
        failures.append(f"final weights within {gap:.1e} of the stock Trainer's, not 1e-5 ({len(exported)} tensors)")
    # from_pretrained of save_model's folder gives the wrapped model's logits.
    x = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(7))
    trainer.model.eval()
    with torch.no_grad():
        ours = trainer.model(input_ids=x).logits
        if rank == 0:
            loaded = AutoModelForCausalLM.from_pretrained(model_dir).eval()
            diff = (loaded(input_ids=x).logits - ours).abs().max().item()
            if diff > 1e-6:
                failures.append(f"from_pretrained(save_model's folder) logits differ by {diff:.1e}")
    # Past the shard size: shards and an index, which from_pretrained reads the same.
    trainer.zoe_max_shard_bytes = 40_000
    sharded = model_dir + "_sharded"
    trainer.save_model(sharded)
    torch.distributed.barrier()
    if rank == 0:
        index = json.load(open(os.path.join(sharded, "model.safetensors.index.json")))
        files = sorted(set(index["weight_map"].values()))
        with torch.no_grad():
            diff = (AutoModelForCausalLM.from_pretrained(sharded).eval()(input_ids=x).logits - ours).abs().max().item()
        if len(files) < 2 or diff > 1e-6 or set(index["weight_map"]) != set(exported):
            failures.append(f"the sharded save ({len(files)} files) gives logits {diff:.1e} apart, or other names")
    ev = trainer.evaluate(dataset(8, seed=2))["eval_loss"]
    if rel(ev, ref["eval_loss"]) > 1e-6:
        failures.append(f"evaluate() {ev} vs the stock Trainer's {ref['eval_loss']}")
    # The stock state_dict() path: full copies (the Trainer's save_model used to write empty tensors).
    sd = trainer.model.state_dict()
    if rank == 0 and not torch.equal(sd["transformer.wte.weight"], exported["transformer.wte.weight"]):
        failures.append("model.state_dict() is not the exported weights")
    return worst


def zoe_trainer(a, out, accum, world, cls=None, args=None, n=None):
    import zoe.integrations.hf as hf
    from transformers import TrainerCallback

    class Norms(TrainerCallback):
        def on_step_end(self, args_, state, control, **kw):
            trainer.zoe_norms.append(trainer.optimizer.optimizer.grad_norm)

    trainer = recording(cls or hf.ZoeTrainer)(
        model=tiny_gpt2(), args=args or arguments(out, B, accum, a.bf16),
        train_dataset=dataset(n or B * world * accum * STEPS), zoe_config=zoe_config(a), callbacks=[Norms()])
    trainer.zoe_norms = []
    return trainer


def resume_one_rank(a):
    """A 1-rank run resuming the 2-rank checkpoint with twice the accumulation."""
    import zoe.integrations.hf  # noqa: F401
    trainer = zoe_trainer(a, os.path.join(a.workdir, "one_rank"), a.accum, 1)
    trainer.train(resume_from_checkpoint=a.resume_from)
    with open(a.out, "w") as f:
        json.dump(step_losses(trainer, a.accum), f)
    trainer.zoe_engine.close()


def resume_checks(a, rank, world, work, first):
    """Steps 6-10 from checkpoint-5 equal the uninterrupted run's, bit for bit: here, and on 1 rank."""
    ckpt = os.path.join(work, "zoe", "checkpoint-5")
    want = step_losses(first, a.accum)[5:]
    again = zoe_trainer(a, os.path.join(work, "again"), a.accum, world)
    again.train(resume_from_checkpoint=ckpt)
    if step_losses(again, a.accum) != want:
        failures.append(f"resumed on {world} ranks: {step_losses(again, a.accum)} != {want}")
    again.zoe_engine.close()
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, want)
    if rank == 0:
        out = os.path.join(work, "one_rank.json")
        cmd = [sys.executable, __file__, "--stage", str(a.stage), "--accum", str(a.accum * world),
               "--resume-from", ckpt, "--out", out, "--workdir", work]
        r = subprocess.run(cmd, env=framework_common.child_env(), capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"1-rank resume failed: {r.stderr[-2000:]}")
        else:
            got = json.load(open(out))
            # The 2-rank step's loss is the mean over ranks; on 1 rank, the sum of halves.
            mean = [sum(col) / world for col in zip(*everyone)]
            # With accumulation 1 here the 1-rank step adds the same two gradients as the 2-rank
            # reduction: bit for bit. With more, the sums run in another order: within 1e-6.
            exact = a.accum == 1
            if (got != mean) if exact else max(rel(g, w) for g, w in zip(got, mean)) > 1e-6:
                failures.append(f"resumed on 1 rank (accumulation {a.accum * world}): {got} != {mean}")
    generate_checks(a, rank, world, work)
    if rank == 0:
        env = dict(framework_common.child_env(), WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
        r = subprocess.run([sys.executable, "-c", "import zoe.integrations.hf"], env=env, capture_output=True,
                           text=True)
        if r.returncode == 0 or "mpirun" not in r.stderr:
            failures.append(f"WORLD_SIZE=2 without mpirun: exit {r.returncode}, {r.stderr[-300:]}")


def generate_checks(a, rank, world, work):
    """predict_with_generate, each rank asking for another length: one gather, then alone."""
    import zoe.integrations.hf as hf
    from transformers import Seq2SeqTrainingArguments
    args = Seq2SeqTrainingArguments(output_dir=os.path.join(work, "gen"), per_device_eval_batch_size=2,
                                    predict_with_generate=True, report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = zoe_trainer(a, None, 1, world, cls=hf.ZoeSeq2SeqTrainer, args=args, n=4)
    engine = trainer.zoe_engine
    before = engine.stats()["comm_bytes"]["all_gather"]
    with hf.zoe.torch.gathered(trainer.model):
        pass
    one_gather = engine.stats()["comm_bytes"]["all_gather"] - before
    prompts = [{"input_ids": torch.randint(0, 64, (4,), generator=torch.Generator().manual_seed(i))}
               for i in range(2 * world)]
    before = engine.stats()["comm_bytes"]["all_gather"]
    new = 2 + 5 * rank
    pred = trainer.predict(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    spent = engine.stats()["comm_bytes"]["all_gather"] - before
    # predict() gathers every rank's rows (rank 0's first), padded with 0 to the longest length.
    rows = torch.as_tensor(pred.predictions)
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, new)
    for r, n in enumerate(everyone):
        mine = rows[2 * r:2 * r + 2]
        want = torch.stack([p["input_ids"] for p in prompts[2 * r:2 * r + 2]])
        if rows.shape[0] != 2 * world or not torch.equal(mine[:, :4], want) or mine[:, 4 + n:].any():
            failures.append(f"rank {r}'s generations {mine.tolist()} are not its prompts and {n} new tokens")
    if world > 1 and a.stage == 3 and spent != one_gather:  # one prediction step per rank
        failures.append(f"predict spent {spent} all_gather bytes, not one gather ({one_gather})")
    # "synced": transformers' synced_gpus, a fetch per forward, every rank until all are done.
    trainer.zoe_generate = "synced"
    synced = torch.as_tensor(trainer.predict(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                             pad_token_id=0).predictions)
    if not torch.equal(synced, rows):
        failures.append(f"synced generation {synced.tolist()} differs from the gathered one {rows.tolist()}")
    engine.close()


def main():
    global A
    a = A = parse()
    torch.set_num_threads(1)
    if a.reference:
        return run_reference(a)
    if a.resume_from:
        return resume_one_rank(a)
    import zoe.integrations.hf  # noqa: F401  (sets RANK, WORLD_SIZE, ... from mpirun's)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    work = tempfile.mkdtemp(prefix="zoe_hf_") if rank == 0 else None
    arguments(os.path.join(tempfile.gettempdir(), "unused"), B, a.accum, a.bf16).device  # starts torch.distributed
    shared = [work]
    torch.distributed.broadcast_object_list(shared, src=0)
    work = shared[0]
    ref = framework_common.shared_reference(__file__, ["--world", str(world), "--accum", str(a.accum)] +
                                            (["--bf16"] if a.bf16 else []), work)
    trainer = zoe_trainer(a, os.path.join(work, "zoe"), a.accum, world)
    trainer.train()
    model_dir = os.path.join(work, "zoe", "final")
    trainer.save_model(model_dir)
    torch.distributed.barrier()
    worst = compare(a, rank, trainer, ref, model_dir)
    trainer.zoe_engine.close()
    if a.resume:
        resume_checks(a, rank, world, work, trainer)
    torch.distributed.barrier()
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
    resumed = ', resumed ' + ('bit for bit' if a.accum == 1 else 'within 1e-6 on 1 rank')
    return framework_common.report(
        failures, f"ZoeTrainer vs the stock Trainer, stage {a.stage}{', nvme' if a.nvme else ''}"
        f"{', bf16' if a.bf16 else ''}, {world} ranks, accumulation {a.accum}, worst per-step loss {worst:.1e}, "
        f"weights {'n/a' if a.bf16 else f'{WEIGHT_GAP[0]:.1e}'}{resumed if a.resume else ''}")

if __name__ == "__main__":
    sys.exit(main())

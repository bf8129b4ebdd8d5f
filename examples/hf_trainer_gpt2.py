"""Hugging Face's Trainer on zoe: GPT-2 on the bytes of data/corpus.txt, ZeRO stage 3 with the
optimizer state and parameters on NVMe, saved where from_pretrained loads it.

    mpirun -np 2 python3 examples/hf_trainer_gpt2.py [--steps 20] [--out /tmp/zoe_hf] [--nvme /tmp/zoe_nvme]

(As root add OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 and --oversubscribe.)
From a DeepSpeed setup, the lines that change: import zoe.integrations.hf first, drop
TrainingArguments(deepspeed=...), and make a ZoeTrainer with zoe_config= instead of a Trainer."""
import argparse
import os

import zoe.integrations.hf  # first: under mpirun it sets RANK, WORLD_SIZE, ... for torch.distributed

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, TrainingArguments

HERE = os.path.dirname(os.path.abspath(__file__))


def windows(ctx, count):
    data = open(os.path.join(HERE, "..", "data", "corpus.txt"), "rb").read()
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(data) - ctx, (count,), generator=g).tolist()
    return [{"input_ids": torch.tensor(list(data[s:s + ctx])), "labels": torch.tensor(list(data[s:s + ctx]))}
            for s in starts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="/tmp/zoe_hf")
    ap.add_argument("--nvme", default="/tmp/zoe_nvme")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4))
    args = TrainingArguments(output_dir=a.out, per_device_train_batch_size=4, learning_rate=1e-3, weight_decay=0.1,
                             max_grad_norm=1.0, max_steps=a.steps, warmup_steps=a.steps // 10,
                             lr_scheduler_type="linear", logging_steps=max(1, a.steps // 5), save_strategy="no",
                             report_to=[], use_cpu=True, disable_tqdm=True)
    os.makedirs(a.nvme, exist_ok=True)
    nvme = {"device": "nvme", "nvme_path": a.nvme}
    trainer = zoe.integrations.hf.ZoeTrainer(
        model=model, args=args, train_dataset=windows(64, 4 * args.world_size * a.steps),
        zoe_config={"zero_optimization": {"stage": 3, "offload_optimizer": nvme, "offload_param": nvme}})
    trainer.train()
    trainer.save_model()  # collective: model.safetensors + config.json in --out
    if args.process_index == 0:
        loaded = AutoModelForCausalLM.from_pretrained(a.out)
        x = windows(64, 1)[0]["input_ids"][None]
        print(f"saved to {a.out}; from_pretrained's loss on a window: {loaded(input_ids=x, labels=x).loss.item():.4f}")
    trainer.zoe_engine.close()


if __name__ == "__main__":
    main()

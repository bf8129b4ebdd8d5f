"""zoe in a raw Accelerate loop: GPT-2 on the bytes of data/corpus.txt at ZeRO stage 3.

    mpirun -np 2 python3 examples/accelerate_gpt2.py [--steps 20] [--accum 2]

(As root add OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 and --oversubscribe.)
The model is wrapped by zoe and not prepared; the ZoeOptimizer, the data and the scheduler go
through zoe.integrations.accelerate.prepare. Launch with mpirun, not `accelerate launch`."""
import argparse
import os

import zoe.integrations.accelerate as za  # first: under mpirun it sets RANK, WORLD_SIZE, ...

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

import zoe
import zoe.integrations
import zoe.torch

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--accum", type=int, default=1)
    a = ap.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=a.accum)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4))
    engine = zoe.Engine(zoe.integrations.config_from(lr=1e-3, weight_decay=0.1, max_grad_norm=1.0,
                                                     zoe_config={"zero_optimization": {"stage": 3}},
                                                     device=accelerator.device))
    model = zoe.torch.wrap(model, engine)
    optimizer = zoe.integrations.ZoeOptimizer(engine, lr=1e-3, weight_decay=0.1)
    n = accelerator.num_processes
    # Accelerate's prepared scheduler steps num_processes times per optimizer step.
    scheduler = get_linear_schedule_with_warmup(optimizer, n * (a.steps // 10), n * a.steps)
    data = open(os.path.join(HERE, "..", "data", "corpus.txt"), "rb").read()
    starts = torch.randint(0, len(data) - 64, (4 * n * a.accum * a.steps,)).tolist()
    windows = torch.stack([torch.tensor(list(data[s:s + 64])) for s in starts])
    loader = torch.utils.data.DataLoader(windows, batch_size=4)
    model, optimizer, loader, scheduler = za.prepare(accelerator, model, optimizer, loader, scheduler)
    for i, batch in enumerate(loader):
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients and accelerator.is_main_process and (i + 1) % (a.accum * 5) == 0:
            print(f"step {(i + 1) // a.accum}: loss {loss.item():.4f}, grad norm {optimizer.optimizer.grad_norm:.4f}, "
                  f"lr {scheduler.get_last_lr()[0]:.2e}")
    engine.close()


if __name__ == "__main__":
    main()

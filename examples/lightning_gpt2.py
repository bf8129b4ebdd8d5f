"""PyTorch Lightning on zoe: GPT-2 on the bytes of data/corpus.txt with strategy="zoe_stage_3".

    mpirun -np 2 python3 examples/lightning_gpt2.py [--steps 20] [--strategy zoe_stage_3_offload]

(As root add OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 and --oversubscribe.)
From a DeepSpeed setup, the lines that change: import zoe.integrations.lightning first, and
strategy="deepspeed_stage_3" becomes strategy="zoe_stage_3" (devices = mpirun's -np)."""
import argparse
import os

import zoe.integrations.lightning  # first: sets RANK, WORLD_SIZE, ... and registers zoe_stage_*

import pytorch_lightning as pl
import torch
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

HERE = os.path.dirname(os.path.abspath(__file__))


class GPT2Module(pl.LightningModule):
    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4))

    def training_step(self, batch, i):
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        params = list(self.parameters())
        opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                 {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-3)
        sched = get_linear_schedule_with_warmup(opt, self.steps // 10, self.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--strategy", default="zoe_stage_3")
    a = ap.parse_args()
    torch.manual_seed(0)
    data = open(os.path.join(HERE, "..", "data", "corpus.txt"), "rb").read()
    starts = torch.randint(0, len(data) - 64, (4 * 8 * a.steps,)).tolist()
    windows = torch.stack([torch.tensor(list(data[s:s + 64])) for s in starts])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(strategy=a.strategy, accelerator="cpu", devices=world, max_steps=a.steps,
                         gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_model_summary=False,
                         log_every_n_steps=max(1, a.steps // 5))
    module = GPT2Module(a.steps)
    trainer.fit(module, torch.utils.data.DataLoader(windows, batch_size=4))
    if trainer.is_global_zero:
        print(f"trained {a.steps} steps with {a.strategy} on {world} ranks; last grad norm "
              f"{trainer.strategy.grad_norm:.4f}, loss {trainer.callback_metrics['loss'].item():.4f}")
    trainer.strategy.close_engine()


if __name__ == "__main__":
    main()

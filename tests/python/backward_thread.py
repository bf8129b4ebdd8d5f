"""On a GPU, PyTorch's autograd runs a backward on a thread of its own (one per device), not on the
thread that called loss.backward(): zoe.torch.wrap's hooks then fetch, release and hand over
gradients from that thread, while the engine was made (and steps) on the caller's. Here each
micro-step's backward runs on another thread, as CUDA's autograd does, at 2 ranks under mpirun,
stage 3 with prefetch, accumulation 2 (the first hand-overs on that thread, the step on the
caller's), and the losses, grad norms and final weights must be bitwise those of the same steps
with the backward on the caller's thread."""
import sys
import threading

import torch

import zoe
import zoe.torch
from tiny_lm import TinyLM, batch

STEPS, ACCUM = 3, 2


def backward_on_another_thread(loss):
    failed = []

    def run():
        try:
            loss.backward()
        except BaseException as e:  # re-raised on the caller's thread
            failed.append(e)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if failed:
        raise failed[0]


def train(threaded):
    torch.manual_seed(0)
    model = TinyLM()
    engine = zoe.Engine({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ACCUM,
                         "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1 << 20},
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}})
    rank = engine.rank
    zoe.torch.wrap(model, engine)
    losses, norms = [], []
    for step in range(STEPS):
        for m in range(ACCUM):
            loss = model(*batch(step * ACCUM + m, rank))
            backward_on_another_thread(loss) if threaded else loss.backward()
            losses.append(loss.item())
        norms.append(engine.step()["grad_norm"])
    with zoe.torch.gathered(model):
        weights = [p.detach().clone() for p in model.parameters()]
    engine.close()
    return rank, losses, norms, weights


def main():
    rank, losses, norms, weights = train(threaded=False)
    _, t_losses, t_norms, t_weights = train(threaded=True)
    failures = []
    if t_losses != losses:
        failures.append(f"losses {t_losses} with the backward on another thread, {losses} on the caller's")
    if t_norms != norms:
        failures.append(f"grad norms {t_norms} with the backward on another thread, {norms} on the caller's")
    if not all(torch.equal(a, b) for a, b in zip(t_weights, weights)) or len(t_weights) != len(weights):
        failures.append("the final weights differ")
    for f in failures:
        print(f"rank {rank}: FAIL: {f}")
    print(f"rank {rank}: {'PASS' if not failures else 'FAIL'}: {STEPS} steps x {ACCUM} micro-steps, the backward on "
          f"another thread: losses {t_losses[-1]:.6f}, norms {t_norms[-1]:.6f} (the caller's thread: {losses[-1]:.6f})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Autograd's saved views of parameters follow the unit's buffer of the moment: a unit whose
backward gets a different buffer than its forward had (here: another unit holds the old one)
still gets the right gradients. Released buffers are poisoned (ZOE_POISON_RELEASED=1), so a
stale view would read NaN or another unit's weights."""
import os
import sys

os.environ["ZOE_POISON_RELEASED"] = "1"

import torch  # noqa: E402

import zoe  # noqa: E402
import zoe.torch  # noqa: E402


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))


def main():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    ref = model()
    ref(x).square().sum().backward()
    want = torch.sqrt(sum(p.grad.square().sum() for p in ref.parameters())).item()

    m = model()
    e = zoe.Engine({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0,
                                          "stage3_max_reuse_distance": 0}})
    zoe.torch.wrap(m, e)
    loss = m(x).square().sum()
    # Units 0 and 2 have the same size: unit 0 now takes the one pooled buffer, which unit 2's
    # forward used, so unit 2's backward gathers into a new one.
    m._zoe.acquire(0)
    loss.backward()
    m._zoe.release(0)
    got = e.step(1e-3)["grad_norm"]
    ok = abs(got - want) <= 1e-5 * want and m._zoe.saved_views > 0
    print(f"{'PASS' if ok else 'FAIL'}: gradient norm {got:.7f}, reference {want:.7f}, "
          f"{m._zoe.saved_views} saved views")
    e.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

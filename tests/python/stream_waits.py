"""On a GPU, zoe's streams must wait for torch's before zoe reuses a unit's buffer (release) or
reads a gradient (hand-over): torch's kernels may still be queued; and torch's stream must be
zoe's caller stream (zoe_set_stream) when zoe hands it weights (fetch) or reads its gradient, so
that torch's later kernels wait for zoe's work by an event, not the host. Here a stand-in plays
torch's stream (zoe.torch._torch_stream, _on_gpu) and a recorder sits between the adapter and the
engine: every release and every unit's gradient hand-over (its first zoe_grad_param; the unit's
others follow at once) must come right after a wait on torch's stream and torch's stream set as
the caller's, every fetch after the first (which finds the GPU) right after the stream is set,
and the training result must be unchanged. Before each such fetch what torch's allocator holds
(a stand-in for torch.cuda.memory_reserved, zoe.torch._torch_memory), less what it held when wrap
found the GPU, is booked in zoe's ledger as activations (zoe_set_activation_bytes): the ledger
ends with the last figure and its device peak covers the highest. zoe_wait_stream, zoe_set_stream
and zoe_set_activation_bytes themselves run on the CPU device (nothing to wait for there) and
refuse an engine that is not started."""
import sys

import torch

import zoe
import zoe.torch

STREAM = 0x5eed  # the stand-in's stream handle
TORCH_BYTES = 3 << 20  # what the stand-in's allocator holds at its first fetch; 4 KiB more each


class Recorder:
    """The engine, with the calls that order against torch's stream logged."""

    def __init__(self, engine):
        self.engine, self.log = engine, []

    def __getattr__(self, name):
        f = getattr(self.engine, name)
        if name not in ("wait_stream", "set_stream", "set_activation_bytes", "fetch", "release", "grad_param",
                        "grads_ready"):
            return f

        def logged(*args):
            self.log.append((name, args[0], args[1] if len(args) > 1 else None))
            return f(*args)
        return logged


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))


def train(on_gpu):
    zoe.torch._on_gpu = lambda t: on_gpu
    zoe.torch._torch_stream = lambda device: STREAM
    held = []
    zoe.torch._torch_memory = lambda device: held.append(TORCH_BYTES + 4096 * len(held)) or held[-1]
    e = zoe.Engine({"zero_optimization": {"stage": 3}})
    rec = Recorder(e)
    m = model()
    zoe.torch.wrap(m, rec)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    m(x).square().sum().backward()
    norm = e.step(1e-3)["grad_norm"]
    ledger = e.stats()["ledger"]["device"]
    e.close()
    return rec.log, norm, ledger


def check(log):
    """Problems: a release or gradient hand-over not right after a wait on the stand-in stream and
    setting it as the caller's; a fetch after the first not right after setting it."""
    bad, releases, grads, fetches = [], 0, 0, 0
    for i, (name, arg, grad) in enumerate(log):
        if name in ("wait_stream", "set_stream") and arg != STREAM:
            bad.append(f"call {i}: {name} with stream {arg:#x}, not torch's {STREAM:#x}")
        if name == "fetch":
            fetches += 1
            if fetches > 1 and (i == 0 or log[i - 1][0] != "set_stream"):
                bad.append(f"call {i}: fetch({arg}) without torch's stream set as the caller's right before it")
            if fetches > 1 and (i < 2 or log[i - 2][0] != "set_activation_bytes"):
                bad.append(f"call {i}: fetch({arg}) without torch's memory booked right before it")
        # grads_ready with a tensor is the zeros of an unused unit, made in host memory.
        if name not in ("release", "grad_param"):
            continue
        releases += name == "release"
        grads += name == "grad_param"
        if name == "grad_param" and i > 0 and log[i - 1][0] == "grad_param":
            continue  # the same unit's hand-over: one wait before its first gradient covers them all
        if i < 2 or [c[0] for c in log[i - 2:i]] != ["wait_stream", "set_stream"]:
            bad.append(f"call {i}: {name}({arg}) without a wait on torch's stream and setting it right before it")
    return bad, releases, grads, fetches


def main():
    ok = True
    e = zoe.Engine({"zero_optimization": {"stage": 3}})
    for call in ("wait_stream", "set_stream", "set_activation_bytes"):
        try:
            getattr(e, call)(STREAM)
            print(f"FAIL: zoe_{call} before zoe_start did not raise")
            ok = False
        except zoe.Error as err:
            print(f"zoe_{call} before zoe_start: {err}")
    e.close()

    log, norm, ledger = train(on_gpu=True)
    bad, releases, grads, fetches = check(log)
    for b in bad:
        print("FAIL:", b)
    ok = ok and not bad and releases > 0 and grads > 0 and fetches > 1
    print(f"{fetches} fetches, {releases} releases and {grads} gradient hand-overs; {len(bad)} of them without "
          "the waits, the caller's stream and torch's memory booked right before")
    booked = [c[1] for c in log if c[0] == "set_activation_bytes"]
    # what it held when wrap found the GPU (the first fetch here) is not booked: 4 KiB more a fetch
    last = 4096 * len(booked)
    if not booked or booked[-1] != last or ledger["activation"] != last or ledger["peak"] < last + ledger["persistent"]:
        print(f"FAIL: torch's memory booked {len(booked)} times, the last {booked[-1:]}, expected {last}; the ledger "
              f"holds {ledger['activation']} as activations, peak {ledger['peak']}, persistent {ledger['persistent']}")
        ok = False
    print(f"torch's memory booked before {len(booked)} fetches: ledger activations {ledger['activation']}, device "
          f"peak {ledger['peak']} (persistent {ledger['persistent']})")

    cpu_log, cpu_norm, cpu_ledger = train(on_gpu=False)
    waits = sum(1 for c in cpu_log if c[0] in ("wait_stream", "set_stream", "set_activation_bytes"))
    if waits or cpu_ledger["activation"]:
        print(f"FAIL: {waits} waits on or settings of a stream or torch's memory for tensors in host memory "
              f"({cpu_ledger['activation']} bytes of activations booked)")
        ok = False
    if norm != cpu_norm:
        print(f"FAIL: the waits changed the result: gradient norm {norm} vs {cpu_norm}")
        ok = False
    print(("PASS" if ok else "FAIL") + f": gradient norm {norm:.7f} either way")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

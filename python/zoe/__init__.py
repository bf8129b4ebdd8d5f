"""zoe: ZeRO-3 training with NVMe offload as a backend of other frameworks.

    engine = zoe.Engine({"zero_optimization": {"stage": 3}, "optimizer": {...}})
    model = zoe.torch.wrap(model, engine)      # PyTorch: parameters, hooks, gradients
    loss = model(x).loss; loss.backward(); engine.step()

Ranks come from mpirun, as for `zoe train`. The keys are those of `zoe train`'s config.
"""
import ctypes
import json as _json

# OpenMPI loads its plugins with dlopen and expects libmpi's symbols to be global; a Python
# extension is loaded with RTLD_LOCAL, so make libmpi global first (as mpi4py does).
for _lib in ("libmpi.so.40", "libmpi.so"):
    try:
        ctypes.CDLL(_lib, mode=ctypes.RTLD_GLOBAL)
        break
    except OSError:
        pass

from . import _zoe  # noqa: E402
from ._zoe import Error  # noqa: E402

__all__ = ["Engine", "Error", "version"]


def version():
    return _zoe.version()


class Engine(_zoe.Engine):
    """One zoe engine: a config (dict or JSON text), then parameters, then training calls."""

    def __init__(self, config):
        super().__init__(config if isinstance(config, str) else _json.dumps(config))

    def step(self, lr=None):
        """One optimizer step (collective); lr None: the config's optimizer/scheduler value."""
        return super().step(-1.0 if lr is None else float(lr))

    def close(self):
        """Waits for a call in progress on another thread and for the last update, then frees the
        engine (its NVMe files go); raises zoe.Error if that update failed. Later calls raise
        zoe.Error("the engine is closed"); closing again does nothing."""
        super().close()

    def stats(self):
        """This rank's ledger (bytes per tier and kind, now and peak) and counters."""
        return _json.loads(self.stats_json())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

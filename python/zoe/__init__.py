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
        self._before_step = []  # zoe.torch.wrap's checks that its model is as wrap left it

    def step(self, lr=None):
        """One optimizer step (collective). lr None: the config's optimizer/scheduler value;
        otherwise a finite number in [0, 1e30], as the config key optimizer.params.lr (a negative,
        NaN or infinite lr raises zoe.Error: it would make every weight NaN, or quietly mean the
        config's). Raises zoe.Error, stepping nothing, while a unit is held (fetched and not
        released, as inside zoe.torch.gathered()): the held weights would not see the update."""
        if lr is not None:
            lr = float(lr)
            if lr < 0:  # the C API's "config's value" sentinel is None here
                raise Error(f"Engine.step: lr {lr} is not a learning rate (>= 0); lr=None takes the config's "
                            "optimizer/scheduler value")
        for check in self._before_step:
            check()
        return super().step(-1.0 if lr is None else lr)

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

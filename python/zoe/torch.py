"""zoe.torch.wrap: train a torch.nn.Module through a zoe engine (ZeRO-3, offload) in a few lines.

    engine = zoe.Engine(config)
    model = zoe.torch.wrap(model, engine)   # registers parameters, installs hooks
    for batch in data:
        loss = model(batch) * engine.loss_scale   # the scale is 1 in fp32 training
        loss.backward()                           # gradients go to zoe as each module's backward ends
        engine.step()                             # replaces optimizer.step() and zero_grad()

Each submodule with parameters of its own is one zoe unit. Outside its forward and backward a
parameter holds no memory (shape [0]); inside, it is a zero-copy view of zoe's gathered buffer
(torch.utils.dlpack). Tensors autograd saves from those buffers are saved as (unit, offset, shape,
strides) and re-made from the unit's buffer of the moment in backward, which fetches it again.
A parameter used by several modules (tied weights) is handed over once every use is done.
"""
import contextlib

import torch
from torch.utils import dlpack as _dlpack

__all__ = ["wrap", "gathered"]

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

if hasattr(torch.Tensor, "untyped_storage"):
    def _storage_ptr(t):
        return t.untyped_storage().data_ptr()
else:  # torch 1.13
    def _storage_ptr(t):
        return t.storage().data_ptr()


class _Param:
    __slots__ = ("param", "name", "offset", "numel", "shape")

    def __init__(self, param, name, offset, numel):
        self.param, self.name, self.offset, self.numel = param, name, offset, numel
        self.shape = tuple(param.shape)


class _Unit:
    __slots__ = ("index", "params", "refs", "flat", "users", "backward_refs", "handed")

    def __init__(self, index):
        self.index, self.params, self.refs, self.flat = index, [], 0, None
        self.handed = False     # its gradient went over in this backward
        self.users = 0          # forward uses whose backward has not ended yet
        self.backward_refs = 0  # fetches made for backward, released when it ends


def wrap(module, engine, decay=None):
    """Puts `module`'s trainable parameters under `engine` and returns `module`.

    decay(name, param) -> bool chooses weight decay (default: tensors of two or more dimensions).
    The engine must be new (not started); it is started here with the module's current values
    (rank 0's count)."""
    module._zoe = _Wrapper(module, engine, decay or (lambda name, p: p.dim() >= 2))
    return module


@contextlib.contextmanager
def gathered(module):
    """Within the block every wrapped parameter holds its full values (zoe's gathered memory, as
    in a forward): to read them, copy a state_dict, or compare with another model. Collective at
    stage 3 (every rank enters the block). Writes to them are not kept: set values through
    zoe.Engine.set_param, or load a checkpoint. A fetch that fails releases what the block had
    fetched before raising."""
    w = module._zoe
    fetched = []
    try:
        for unit in w.units:
            w.acquire(unit.index)
            fetched.append(unit.index)
        yield module
    finally:
        for u in reversed(fetched):
            w.release(u)


class _Wrapper:
    def __init__(self, module, engine, decay):
        self.engine = engine
        self.units = []
        self.live = {}  # storage address of a fetched unit's buffer -> unit index
        self.callback_queued = False
        self.saved_views = 0  # saved tensors that autograd kept as descriptors of a unit's buffer
        owned = {}      # id(param) -> its _Param
        module_units = []
        for mname, mod in module.named_modules():
            mine = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad]
            for pname, p in mine:
                if id(p) in owned:
                    continue  # tied: registered with its first module
                if p.dtype not in _DTYPES:
                    raise TypeError(f"zoe.torch.wrap: parameter {mname}.{pname} is {p.dtype}")
                name = f"{mname}.{pname}" if mname else pname
                engine.register_param(mname or "<root>", name, list(p.shape), _DTYPES[p.dtype], bool(decay(name, p)))
                owned[id(p)] = _Param(p, name, 0, p.numel())
            if mine:
                module_units.append((mod, [id(p) for _, p in mine]))
        engine.start()
        for ps in owned.values():
            u, ps.offset, ps.numel = engine.param_info(ps.name)
            while len(self.units) <= u:
                self.units.append(_Unit(len(self.units)))
            self.units[u].params.append(ps)
            engine.set_param(ps.name, _dlpack.to_dlpack(ps.param.detach().cpu().contiguous()))
            ps.param.data = self._empty(ps.param)
        for mod, ids in module_units:
            units = sorted({engine.unit_index(owned[i].name) for i in ids})
            self._hook(mod, units)
        forward = module.forward

        def forward_saving_descriptors(*args, **kwargs):
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return forward(*args, **kwargs)
        module.forward = forward_saving_descriptors

    @staticmethod
    def _empty(p):
        return torch.empty(0, dtype=p.dtype, device=p.device)

    # --- fetch and release: parameters become views of the unit's buffer, and empty again ---
    def acquire(self, u):
        unit = self.units[u]
        if unit.refs == 0:
            unit.flat = _dlpack.from_dlpack(self.engine.fetch(u))
            self.live[_storage_ptr(unit.flat)] = u
            for ps in unit.params:
                ps.param.data = unit.flat[ps.offset:ps.offset + ps.numel].view(ps.shape)
        unit.refs += 1

    def release(self, u):
        unit = self.units[u]
        unit.refs -= 1
        if unit.refs == 0:
            for ps in unit.params:
                ps.param.data = self._empty(ps.param)
            del self.live[_storage_ptr(unit.flat)]
            unit.flat = None
            self.engine.release(u)

    # --- saved tensors: a view of a unit's buffer is saved as a descriptor, re-made in backward ---
    def _pack(self, t):
        u = self.live.get(_storage_ptr(t))
        if u is None:
            return t
        self.saved_views += 1
        return ("zoe", u, t.storage_offset(), tuple(t.shape), tuple(t.stride()))

    def _unpack(self, saved):
        if not (isinstance(saved, tuple) and len(saved) == 5 and saved[0] == "zoe"):
            return saved
        _, u, offset, shape, stride = saved
        unit = self.units[u]
        if unit.refs == 0:  # a module whose backward began without our pre-backward hook
            self.acquire(u)
            unit.backward_refs += 1
            self._queue_backward_end()
        return unit.flat.as_strided(shape, stride, offset)

    # --- hooks ---
    def _hook(self, mod, units):
        wrapper = self

        def pre_forward(m, inputs):
            for u in units:
                wrapper.acquire(u)
            if torch.is_grad_enabled():
                for u in units:
                    wrapper.units[u].users += 1
                return _attach(_AfterBackward, wrapper, units, inputs)
            return None

        def post_forward(m, inputs, output):
            for u in units:
                wrapper.release(u)
            if torch.is_grad_enabled():
                return _attach(_BeforeBackward, wrapper, units, output)
            return None
        mod.register_forward_pre_hook(pre_forward)
        mod.register_forward_hook(post_forward)

    def before_backward(self, units):
        self._queue_backward_end()
        for u in units:
            self.acquire(u)
            self.units[u].backward_refs += 1

    def after_backward(self, units):
        for u in units:
            unit = self.units[u]
            unit.users -= 1
            if unit.users == 0:
                self._hand_over(unit)
            if unit.backward_refs > 0:
                unit.backward_refs -= 1
                self.release(u)

    def _queue_backward_end(self):
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)

    # The end of the whole backward: units whose modules took no input that needs a gradient
    # (embeddings of token ids) never saw their after-backward; they go over now, last unit first.
    # A unit this rank did not use (another rank may have) goes over as zeros: every rank hands
    # over every unit, as zoe requires.
    def _backward_end(self):
        self.callback_queued = False
        for unit in reversed(self.units):
            if unit.users > 0:
                unit.users = 0
                self._hand_over(unit)
            if not unit.handed:
                numel = sum(ps.numel for ps in unit.params)
                self.engine.grads_ready(unit.index, _dlpack.to_dlpack(torch.zeros(numel)))
            unit.handed = False
            while unit.backward_refs > 0:
                unit.backward_refs -= 1
                self.release(unit.index)

    def _hand_over(self, unit):
        handed = False
        for ps in unit.params:
            g = ps.param.grad
            if g is None:
                continue
            if g.is_cuda:
                torch.cuda.current_stream(g.device).synchronize()
            self.engine.grad_param(ps.name, _dlpack.to_dlpack(g))
            ps.param.grad = None
            handed = True
        if handed:
            self.engine.grads_ready(unit.index, None)
            unit.handed = True


def _attach(fn, wrapper, units, value):
    """value with fn (an identity autograd function) applied to the tensors in it that need a
    gradient; None when there are none (the hook then leaves the value as it is)."""
    if isinstance(value, torch.Tensor):
        return fn.apply(wrapper, units, value)[0] if value.requires_grad else None
    if isinstance(value, (tuple, list)):
        idx = [i for i, v in enumerate(value) if isinstance(v, torch.Tensor) and v.requires_grad]
        if not idx:
            return None
        out = list(value)
        for i, t in zip(idx, fn.apply(wrapper, units, *[value[i] for i in idx])):
            out[i] = t
        if isinstance(value, list):
            return out
        return type(value)(*out) if hasattr(value, "_fields") else tuple(out)  # namedtuples too
    if isinstance(value, dict):
        keys = [k for k, v in value.items() if isinstance(v, torch.Tensor) and v.requires_grad]
        if not keys:
            return None
        for k, t in zip(keys, fn.apply(wrapper, units, *[value[k] for k in keys])):
            value[k] = t
        return value
    return None


def _identity_calling(method, doc):
    """An identity autograd function whose backward first calls wrapper.<method>(units)."""

    def forward(ctx, wrapper, units, *tensors):
        ctx.wrapper, ctx.units = wrapper, units
        return tuple(t.detach() for t in tensors)

    def backward(ctx, *grads):
        getattr(ctx.wrapper, method)(ctx.units)
        return (None, None) + grads

    return type(method, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward), "__doc__": doc})


# On a module's outputs: its backward begins when their gradients arrive, so fetch first.
_BeforeBackward = _identity_calling("before_backward", "fetches a module's units as its backward begins")
# On a module's inputs: their gradients leave once the module's backward (and its parameters'
# gradient accumulation, which autograd runs first) is done.
_AfterBackward = _identity_calling("after_backward", "hands gradients over as a module's backward ends")

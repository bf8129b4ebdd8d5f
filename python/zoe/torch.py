"""zoe.torch.wrap: train a torch.nn.Module through a zoe engine (ZeRO-3, offload) in a few lines.

    engine = zoe.Engine(config)
    model = zoe.torch.wrap(model, engine)   # registers parameters, installs hooks
    for batch in data:
        loss = model(batch) * engine.loss_scale   # the scale is 1 in fp32 training
        loss.backward()                           # gradients go to zoe as each module's backward ends
        engine.step()                             # replaces optimizer.step() and zero_grad()

Each submodule with parameters of its own is one zoe unit. wrap places the module on zoe's device
(zoe.device: a GPU engine's empty parameters and the module's buffers go to that GPU; a parameter
already on another device than zoe's is an error). Outside its forward and backward a
parameter holds no memory (shape [0]); inside, it is a zero-copy view of zoe's gathered buffer
(torch.utils.dlpack). Tensors autograd saves from those buffers are saved as (unit, offset, shape,
strides) and re-made from the unit's buffer of the moment in backward, which fetches it again.
A parameter used by several modules (tied weights) is handed over once every use is done.

A parameter read where its unit is not fetched (another module's forward reads it, as a tied head
`h @ self.wte.weight.t()` does in its parent's forward, or a loss function does) is fetched on
demand: wrapped parameters are a torch.nn.Parameter subclass whose __torch_function__ sees every op
on them. Inside a forward the unit is then held like one of the enclosing module's own (the
innermost module with parameters of its own, or the wrapped module): released when that forward
ends, fetched again for its backward, and its gradient handed over only once that backward is done
too. Outside any forward the unit is held for that one op (a view of it the op returns is copied);
its gradient goes over when the whole backward ends. Queries of shape and the like (size(), numel(),
.grad) outside a forward do not fetch: they see the empty parameter. At stage 3 a fetch is
collective, so every rank must make the same reads in the same order, as it makes the same
forwards. register_external_parameter(module, param) makes `param` part of `module`'s fetches instead,
as DeepSpeed's function of that name does.

model.state_dict() holds full copies of the weights in host memory (each unit fetched, copied and
released in turn: collective at stage 3, so every rank calls it), so that torch.save(model.state_dict())
and transformers' save_pretrained save the model; tied parameters share one copy. state_dict(
keep_vars=True) returns the parameters themselves, as torch does: inside gathered() only (it raises
elsewhere, where they are empty). named_parameters() yields the parameters: empty outside a forward.

wrap registers the model's trainable parameters as they are. Changes zoe cannot follow raise,
naming the parameter, at the next outermost forward or engine.step(): a parameter added (or
replaced) after wrap, one frozen (requires_grad_(False)) or unfrozen after wrap, one converted to
another dtype (model.double(), .half(), .to(dtype)). wrap refuses a model with a parameter that
another wrap already put under an engine (shared between two wrapped models). engine.step() raises
while units are held (inside gathered(), or fetched and not released).

On a GPU, zoe's streams wait for torch's current stream (an event, zoe_wait_stream) before each
release and each gradient hand-over, since a kernel torch queued may still read the weights or
write the gradient; and torch's stream waits for zoe's (zoe_set_stream) for a fetched unit's
weights and for zoe's read of a handed-over gradient, so neither call waits on the host and Python
runs ahead of the GPU as it does without zoe (tests/python/stream_waits.py).
"""
import contextlib
import functools
import types

import torch
from torch.utils import dlpack as _dlpack

__all__ = ["wrap", "gathered", "register_external_parameter", "describe"]

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

if hasattr(torch.Tensor, "untyped_storage"):
    def _storage_ptr(t):
        return t.untyped_storage().data_ptr()
else:  # torch 1.13
    def _storage_ptr(t):
        return t.storage().data_ptr()

# Runs an op as a plain tensor op (what torch.nn.Parameter's own __torch_function__ does).
_plain_ops = getattr(torch._C, "DisableTorchFunctionSubclass", None) or torch._C.DisableTorchFunction

_live = {}  # storage address of a fetched unit's buffer -> its _Unit (any wrapper's)


class _Param:
    __slots__ = ("param", "name", "offset", "numel", "shape", "dtype", "empty")

    def __init__(self, param, name, offset, numel):
        self.param, self.name, self.offset, self.numel = param, name, offset, numel
        self.shape, self.dtype = tuple(param.shape), param.dtype
        self.empty = None  # what the parameter holds while its unit is released


class _Unit:
    __slots__ = ("wrapper", "index", "params", "refs", "flat", "users", "backward_refs", "handed")

    def __init__(self, wrapper, index):
        self.wrapper, self.index, self.params, self.refs, self.flat = wrapper, index, [], 0, None
        self.handed = False     # its gradient went over in this backward
        self.users = 0          # forward uses whose backward has not ended yet
        self.backward_refs = 0  # fetches made for backward, released when it ends


class _Frame:
    """A forward in progress of a hooked module (or of the wrapped module): the units it holds,
    its own first, then those its code read on demand."""
    __slots__ = ("units", "grad")

    def __init__(self, units, grad):
        self.units, self.grad = units, grad


def wrap(module, engine, decay=None):
    """Puts `module`'s trainable parameters under `engine` and returns `module`.

    decay(name, param) -> bool chooses weight decay (default: tensors of two or more dimensions).
    The engine must be new (not started); it is started here with the module's current values
    (rank 0's count). Parameters with requires_grad False stay torch's. Raises ValueError when a
    parameter is already under an engine (another wrapped model shares it)."""
    module._zoe = _Wrapper(module, engine, decay or (lambda name, p: p.dim() >= 2))
    return module


@contextlib.contextmanager
def gathered(module):
    """Within the block every wrapped parameter holds its full values (zoe's gathered memory, as
    in a forward): to read them, or compare with another model (state_dict() needs no block: it
    gathers unit by unit). Collective at stage 3 (every rank enters the block). Writes to them are
    not kept: set values through zoe.Engine.set_param, or load a checkpoint. engine.step() inside
    the block raises (the held units would keep their old values). A fetch that fails releases
    what the block had fetched before raising."""
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


def register_external_parameter(module, param):
    """Makes `param`, a parameter of another module of a model wrapped by wrap(), part of
    `module`'s fetches: fetched as `module`'s forward and backward begin, released as they end,
    its gradient handed over once they are done, as if it were `module`'s own (DeepSpeed's
    deepspeed.zero.register_external_parameter). Without it such a read is fetched on demand."""
    if getattr(param, "_zoe_unit", None) is None:
        raise ValueError("zoe.torch.register_external_parameter: the parameter is not one that "
                         "zoe.torch.wrap put under an engine")
    wrapper = param._zoe_unit.wrapper
    if not any(m is module for m in wrapper.root.modules()):
        raise ValueError(f"zoe.torch.register_external_parameter: {type(module).__name__} is not part of "
                         "the module the parameter was wrapped with")
    units = wrapper.hooked.get(module)
    if units is None:
        wrapper._hook(module, [param._zoe_unit.index])
    elif param._zoe_unit.index not in units:
        units.append(param._zoe_unit.index)


def _refuse_wrapped_parameters(module):
    """A parameter another wrap already put under an engine (a model sharing it with this one, or
    this model wrapped twice) holds its values there, not here: refused by name."""
    for name, p in module.named_parameters():
        if getattr(p, "_zoe_unit", None) is not None:
            raise ValueError(f"zoe.torch.wrap: parameter '{name}' is already under a zoe engine (zoe.torch.wrap "
                             "of another model that shares it, or of this one before); a parameter can belong "
                             "to one wrapped model only")


def _parameter_keys(module, prefix):
    """(key, parameter) for each parameter entry module.state_dict(prefix=prefix) makes: shared
    modules and tied parameters under each of their names, as torch's state_dict lists them."""
    for name, p in module._parameters.items():
        if p is not None:
            yield prefix + name, p
    for name, child in module._modules.items():
        if child is not None:
            yield from _parameter_keys(child, prefix + name + ".")


class _ZoeParameter(torch.nn.Parameter):
    """A wrapped parameter: an op that reads its values while its unit is released fetches the
    unit first (see the module's docstring)."""

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        released = []
        _released_units(args, released)
        _released_units(kwargs.values(), released)
        if released:
            wrapper = released[0].wrapper
            when = _when_to_fetch(func)
            if when == _ALWAYS or (when == _IN_FORWARD and wrapper.frames):
                return wrapper.on_demand(func, args, kwargs, released)
        with _plain_ops():
            return func(*args, **kwargs)


def _released_units(values, out):
    """Appends to `out` the units, not yet in it, of the released wrapped parameters in values
    (lists and tuples looked into, as torch.cat's argument)."""
    for v in values:
        if type(v) is _ZoeParameter:
            unit = getattr(v, "_zoe_unit", None)  # None in a copy (copy.deepcopy)
            if unit is not None and unit.refs == 0 and not any(unit is u for u in out):
                out.append(unit)
        elif type(v) in (list, tuple):
            _released_units(v, out)


# When an op on a released parameter fetches it: always (it reads the values), only inside a
# forward (it asks for the shape: the true one there, [0] elsewhere, so that numel() outside
# counts what torch holds and state_dict()'s detach() fetches nothing: its hook, _full_state_dict,
# then copies the units one at a time), or never (the answer is
# the same either way, as for dtype, which transformers asks in every forward).
_ALWAYS, _IN_FORWARD, _NEVER = 2, 1, 0
_SHAPE_QUERIES = {getattr(torch.Tensor, n) for n in (
    "size", "dim", "numel", "nelement", "ndimension", "stride", "storage_offset", "is_contiguous",
    "__len__", "data_ptr", "storage", "untyped_storage", "_is_view", "__repr__", "__format__",
    "__reduce_ex__", "__deepcopy__", "detach", "detach_") if hasattr(torch.Tensor, n)}
_SAME_EITHER_WAY = {getattr(torch.Tensor, n) for n in (
    "element_size", "is_floating_point", "is_complex", "get_device", "is_shared", "is_pinned",
    "__dlpack_device__", "register_hook", "retain_grad", "requires_grad_", "share_memory_",
    "__setstate__") if hasattr(torch.Tensor, n)}
_VIEW_ATTRIBUTES = {"T", "mT", "H", "mH", "real", "imag"}
_SHAPE_ATTRIBUTES = {"shape", "ndim", "data"}


# zoe's streams wait for torch's before zoe reuses a unit's buffer (zoe_release) or reads a
# gradient (hand-over): torch queues kernels on its current stream, and one that still reads the
# weights or writes the gradient may not have run yet. And torch's stream is zoe's caller stream
# (zoe_set_stream): it waits for a fetch's gather and for zoe's read of a gradient. Events, not
# host waits. Module-level so that a test can stand in for torch's stream without a GPU.
def _on_gpu(t):
    return t.is_cuda


def _torch_stream(device):
    return torch.cuda.current_stream(device).cuda_stream


# What torch's allocator holds on zoe's GPU (its activations, gradients before their hand-over):
# what it took since zoe found the GPU is booked in zoe's ledger before each fetch
# (zoe_set_activation_bytes), so that zoe keeps and prefetches units only in what torch leaves of
# zoe.device_memory_budget. What torch held before is outside the budget ("auto" measured the
# GPU's free memory without it), so never counted twice. Module-level so that a test can stand in
# for it without a GPU.
def _torch_memory(device):
    return torch.cuda.memory_reserved(device)


# Where zoe's memory is, as torch names it (zoe_device: DLPack's kDLCPU 1, kDLCUDA 2).
def _engine_device(engine):
    kind, index = engine.device()
    return torch.device("cuda", index) if kind == 2 else torch.device("cpu")


def _place_unowned(module, where):
    """What zoe does not hold goes where its memory is, as DeepSpeed's engine moves the module: the
    buffers (a causal mask, rotary frequencies) and the frozen parameters (a LoRA's base weights, a
    frozen embedding), which a forward reads beside the weights. A frozen parameter keeps its
    object where torch can swap its data (CPU to a GPU: what refers to it still does), as
    Module.to does; else it is replaced by a frozen Parameter there."""
    for mod in module.modules():
        for key, b in mod._buffers.items():
            if b is not None and b.device != where:
                mod._buffers[key] = b.to(where)
        for key, p in mod._parameters.items():
            if p is not None and not p.requires_grad and p.device != where:
                moved = p.data.to(where)
                if torch._has_compatible_shallow_copy_type(p.data, moved):
                    p.data = moved
                else:
                    mod._parameters[key] = torch.nn.Parameter(moved, requires_grad=False)


def _when_to_fetch(func):
    if isinstance(getattr(func, "__self__", None), types.GetSetDescriptorType):  # an attribute
        name = func.__self__.__name__
        if func.__name__ != "__get__":
            return _NEVER  # .data = ..., .grad = ...: how zoe itself fills and empties them
        return _ALWAYS if name in _VIEW_ATTRIBUTES else _IN_FORWARD if name in _SHAPE_ATTRIBUTES else _NEVER
    if func in _SAME_EITHER_WAY:
        return _NEVER
    return _IN_FORWARD if func in _SHAPE_QUERIES else _ALWAYS


class _Wrapper:
    def __init__(self, module, engine, decay):
        self.engine = engine
        self.root = module
        self.units = []
        self.hooked = {}   # module -> the units its forward fetches (its own, then registered ones)
        self.frames = []   # forwards in progress, innermost last
        self.callback_queued = False
        self.saved_views = 0  # saved tensors that autograd kept as descriptors of a unit's buffer
        self.on_demand_fetches = 0
        self.fetch_trace = None  # zoe.torch.describe's callback(unit, in backward) at each fetch
        self.gpu = None  # zoe's GPU as a torch device (from zoe_device, or the first fetch's memory)
        self.torch_base = 0  # what torch's allocator held there when zoe found the GPU
        _refuse_wrapped_parameters(module)
        # Parameters left out (frozen), by id, held so that no later tensor takes their id.
        self.frozen = {id(p): p for p in module.parameters() if not p.requires_grad}
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
        where = _engine_device(engine)
        for ps in owned.values():
            if ps.param.device.type != "cpu" and ps.param.device != where:  # another GPU's too
                fix = ("zoe takes its rank's local GPU (OMPI_COMM_WORLD_LOCAL_RANK modulo the GPUs visible): "
                       "place the model there" if ps.param.device.type == where.type else "set zoe.device to match")
                raise ValueError(f"zoe.torch.wrap: parameter {ps.name} is on {ps.param.device} but zoe's memory is on "
                                 f"{where} (zoe.device): the forward would meet zoe's weights on another device; "
                                 f"{fix}, or leave the model on the CPU for zoe to place")
        _place_unowned(module, where)
        if where.type == "cuda":
            self.found_gpu(where)  # every fetch, the first too, ordered for torch's stream by an event
        for ps in owned.values():
            u, ps.offset, ps.numel = engine.param_info(ps.name)
            while len(self.units) <= u:
                self.units.append(_Unit(self, len(self.units)))
            self.units[u].params.append(ps)
            engine.set_param(ps.name, _dlpack.to_dlpack(ps.param.detach().cpu().contiguous()))
            ps.empty = torch.empty(0, dtype=ps.param.dtype, device=where)  # (model.device says where)
            ps.param.data = ps.empty
            ps.param.__class__ = _ZoeParameter
            ps.param._zoe_unit = self.units[u]
        self.owned = owned
        for mod, ids in module_units:
            self._hook(mod, sorted({engine.unit_index(owned[i].name) for i in ids}))
        module._register_state_dict_hook(self._full_state_dict)
        if getattr(engine, "_before_step", None) is not None:
            engine._before_step.append(self.check_parameters)
        forward = module.forward

        # functools.wraps keeps forward's signature for inspect.signature: transformers' Trainer
        # reads it to choose the dataset columns it keeps (a bare (*args, **kwargs) lost input_ids).
        @functools.wraps(forward)
        def forward_saving_descriptors(*args, **kwargs):
            # The wrapped module's forward is a frame too, unless its own hook made one: reads
            # on demand outside every hooked module are held until it ends.
            frame = None if self.frames else self.enter([])
            try:
                with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
                    out = forward(*args, **kwargs)
            except BaseException:
                self.unwind()
                raise
            if frame is None:
                return out
            self.leave()
            attached = _attach(_BeforeBackward, self, frame.units, out) if frame.grad and frame.units else None
            return out if attached is None else attached
        module.forward = forward_saving_descriptors

    def found_gpu(self, device):
        self.gpu = device
        self.torch_base = _torch_memory(device)

    # --- fetch and release: parameters become views of the unit's buffer, and empty again ---
    def acquire(self, u):
        unit = self.units[u]
        if unit.refs == 0:
            if self.fetch_trace is not None:
                self.fetch_trace(u, self.callback_queued)
            if self.gpu is not None:  # torch's kernels on its current stream read the weights
                self.engine.set_activation_bytes(max(0, _torch_memory(self.gpu) - self.torch_base))
                self.engine.set_stream(_torch_stream(self.gpu))
            unit.flat = _dlpack.from_dlpack(self.engine.fetch(u))
            if self.gpu is None and _on_gpu(unit.flat):
                self.found_gpu(unit.flat.device)
            _live[_storage_ptr(unit.flat)] = unit
            for ps in unit.params:
                ps.param.data = unit.flat[ps.offset:ps.offset + ps.numel].view(ps.shape)
        unit.refs += 1

    def release(self, u):
        unit = self.units[u]
        unit.refs -= 1
        if unit.refs == 0:
            for ps in unit.params:
                ps.param.data = ps.empty
            del _live[_storage_ptr(unit.flat)]
            self._after_torch(unit.flat)
            unit.flat = None
            self.engine.release(u)

    def _after_torch(self, t):
        """zoe's later work waits for torch's kernels queued so far on t's device, and torch's
        stream is the one that waits for zoe's next read of t (see _on_gpu)."""
        if _on_gpu(t):
            stream = _torch_stream(t.device)
            self.engine.wait_stream(stream)
            self.engine.set_stream(stream)

    # --- what wrap registered, checked at each outermost forward and each step ---
    def check_parameters(self):
        """Raises naming the first parameter that changed since wrap in a way zoe cannot follow:
        added (or replaced by a new Parameter), frozen, unfrozen, or converted to another dtype.
        zoe would go on updating what wrap registered, as it was then. Attributes are read as plain
        tensors' (_plain_ops): 0.15 ms for 200 parameters instead of 0.75."""
        with _plain_ops():
            for name, p in self.root.named_parameters():
                problem = self._changed(p)
                if problem:
                    raise RuntimeError(f"zoe.torch: parameter '{name}' {problem}")

    def _changed(self, p):
        ps = self.owned.get(id(p))
        if ps is not None:
            if not p.requires_grad:
                return ("was set requires_grad=False after zoe.torch.wrap, and zoe would still update it; "
                        "freeze parameters before wrap (wrap leaves frozen ones to torch)")
            if p.dtype != ps.dtype:
                return (f"is {p.dtype} now but was {ps.dtype} at zoe.torch.wrap (model.double(), .half() or "
                        f".to(dtype) after wrap?), and zoe trains it in {ps.dtype}; convert before wrap")
            return None
        if not p.requires_grad:
            return None  # zoe does not train it, and nobody asks it to
        if id(p) in self.frozen:
            return ("had requires_grad=False at zoe.torch.wrap and requires a gradient now; zoe never "
                    "updates it: unfreeze parameters before wrap")
        return ("was added after zoe.torch.wrap (a new module or Parameter, or one replaced), and zoe "
                "would never update it while its .grad grows; add it before wrap")

    # --- state_dict(): full copies in host memory, one unit at a time ---
    def _full_state_dict(self, module, state_dict, prefix, local_metadata):
        """The root's state_dict hook: each wrapped parameter's entry (empty outside a forward)
        becomes a full copy in host memory, so that torch.save(model.state_dict()) and
        transformers' save_pretrained save the weights. Units are gathered one at a time
        (collective at stage 3); tied parameters share one copy, as they share one tensor."""
        entries = [(k, p) for k, p in _parameter_keys(module, prefix) if k in state_dict and id(p) in self.owned]
        if any(state_dict[k] is p for k, p in entries):  # keep_vars=True: the parameters themselves
            released = [k for k, p in entries if p._zoe_unit.refs == 0]
            if released:
                raise RuntimeError(f"zoe.torch: state_dict(keep_vars=True) returns the wrapped parameters "
                                   f"themselves, and '{released[0]}' holds no values outside a forward; call "
                                   "it inside `with zoe.torch.gathered(model):`, or use state_dict() for copies")
            return None
        copies = self._host_copies([p for _, p in entries])
        for k, p in entries:
            state_dict[k] = copies[id(p)]
        return None

    def _host_copies(self, params):
        """{id(param): its full values, copied to host memory}: each unit fetched, copied, released
        in turn, so that only one unit is gathered at a time (beside those held already)."""
        by_unit = {}
        for p in params:
            by_unit.setdefault(p._zoe_unit.index, {})[id(p)] = p
        copies = {}
        for u in sorted(by_unit):
            self.acquire(u)
            try:
                for key, p in by_unit[u].items():
                    with _plain_ops():
                        copies[key] = p.detach().to("cpu", copy=True)
            finally:
                self.release(u)
        return copies

    # --- forwards in progress ---
    def enter(self, units):
        if not self.frames:  # an outermost forward: the model must be as wrap registered it
            self.check_parameters()
        frame = _Frame(list(units), torch.is_grad_enabled())
        self.frames.append(frame)
        for u in frame.units:
            self.acquire(u)
            if frame.grad:
                self.units[u].users += 1
        return frame

    def leave(self):
        frame = self.frames.pop()
        for u in reversed(frame.units):
            self.release(u)
        return frame

    def unwind(self):
        """A forward raised: what its frames hold goes back, and their uses count no more."""
        while self.frames:
            frame = self.leave()
            if frame.grad:
                for u in frame.units:
                    self.units[u].users -= 1

    def on_demand(self, func, args, kwargs, units):
        """Runs func, which reads the values of released units: fetched for the enclosing forward
        (held by its frame from now on), or, outside any forward, for this op alone."""
        if any(unit.wrapper is not self for unit in units):
            raise RuntimeError("zoe.torch: one op reads released parameters of two wrapped models; "
                               "fetch one of them first with zoe.torch.gathered()")
        for unit in units:
            self.acquire(unit.index)
            self.on_demand_fetches += 1
        if self.frames:
            frame = self.frames[-1]
            for unit in units:
                frame.units.append(unit.index)
                if frame.grad:
                    unit.users += 1
            with _plain_ops():
                return func(*args, **kwargs)
        try:
            if torch.is_grad_enabled():
                for unit in units:
                    unit.users += 1  # its gradient goes over when the whole backward ends
            with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack), _plain_ops():
                out = func(*args, **kwargs)
            out = _copy_views(out, {_storage_ptr(unit.flat) for unit in units})
            # the backward through it ends by handing those units over, even with no module in it
            attached = _attach(_BeforeBackward, self, [], out) if torch.is_grad_enabled() else None
            return out if attached is None else attached
        finally:
            for unit in reversed(units):
                self.release(unit.index)

    # --- hooks ---
    def _hook(self, mod, units):
        """mod's forward and backward fetch `units` (a list that register_external_parameter may
        extend later)."""
        wrapper = self
        self.hooked[mod] = units

        def pre_forward(m, inputs):
            frame = wrapper.enter(units)
            if frame.grad:
                # the frame's list itself: units read on demand in this forward join it
                return _attach(_AfterBackward, wrapper, frame.units, inputs)
            return None

        def post_forward(m, inputs, output):
            frame = wrapper.leave()
            if frame.grad:
                return _attach(_BeforeBackward, wrapper, frame.units, output)
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
    # (embeddings of token ids) never saw their after-backward, nor units read outside any
    # forward; they go over now, last unit first. So does any gradient that reached a unit after
    # its hand-over (zoe adds the two). A unit this rank did not use (another rank may have) goes
    # over as zeros: every rank hands over every unit, as zoe requires.
    def _backward_end(self):
        self.callback_queued = False
        for unit in reversed(self.units):
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
            if not handed:  # one wait covers the unit: torch queued all its gradients before this
                self._after_torch(g)
            self.engine.grad_param(ps.name, _dlpack.to_dlpack(g))
            ps.param.grad = None
            handed = True
        if handed:
            self.engine.grads_ready(unit.index, None)
            unit.handed = True


# --- saved tensors: a view of a unit's buffer is saved as a descriptor, re-made in backward ---
def _pack(t):
    unit = _live.get(_storage_ptr(t))
    if unit is None:
        return t
    unit.wrapper.saved_views += 1
    return ("zoe", unit, t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def _unpack(saved):
    if not (isinstance(saved, tuple) and len(saved) == 5 and saved[0] == "zoe"):
        return saved
    _, unit, offset, shape, stride = saved
    if unit.refs == 0:  # a module whose backward began without our pre-backward hook
        unit.wrapper.acquire(unit.index)
        unit.backward_refs += 1
        unit.wrapper._queue_backward_end()
    return unit.flat.as_strided(shape, stride, offset)


def _copy_views(value, buffers):
    """value with its tensors that are views of the given buffers (storage addresses) copied:
    what an op outside any forward returns must outlive the unit's release."""
    if isinstance(value, torch.Tensor):
        if type(value) is not _ZoeParameter and value.layout == torch.strided and _storage_ptr(value) in buffers:
            return value.clone()
        return value
    if type(value) in (tuple, list):
        return type(value)(_copy_views(v, buffers) for v in value)
    return value


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


from .describe import describe  # noqa: E402  (it reads the wrapper above)

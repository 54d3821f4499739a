"""A virtual accelerator for tests: CUDA's device rule, emulated on the CPU.

On a real GPU a batch that a loop forgot to move fails with ``RuntimeError: Expected
all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!``;
on a CPU-only machine (CI, this one) the same code runs. Under `VirtualDevice` (a
`torch.overrides.TorchFunctionMode`) every tensor is either *on the device* (tagged) or
*on the host*, and an op that mixes the two fails as on CUDA. Values are computed as
always, on the CPU: only the errors are added.

Which tensors are on the device (the training device is the CPU here, so an explicit
``"cpu"`` means the device; ``"cuda"`` is taken to mean it too and runs on the CPU):

- the result of ``Tensor.to(device)`` / ``.to(tensor_on_device)`` / ``.cuda()`` /
  ``.type_as(tensor_on_device)``; ``.to(dtype)`` keeps the tensor's place;
- the parameters and buffers of a module after ``Module.to(device)`` / ``.cuda()``
  (these go through ``Tensor.to`` and ``param.data = ...``);
- tensors a factory made with an explicit ``device=`` (``torch.zeros(3, device=dev)``,
  ``torch.tensor(x, device=dev)``, ``zeros_like(x, device=dev)``...), except
  ``device=x.device`` of a host tensor x: ``.device`` of a host tensor is `HOST`, a
  ``cpu`` device recognised by identity, so that the idiom follows x as on CUDA;
- every output of an op any of whose tensor inputs is on the device (views, ``*_like``,
  ``.grad`` of a parameter on the device, ``clone``, optimizer state...).

Everything else is on the host: data sets, DataLoader batches, ``torch.from_numpy``,
factories without ``device=``, and ``Tensor.cpu()`` (a copy, as on CUDA).

The place is a property of the *storage* (kept in a weak dictionary keyed by the
tensor's `UntypedStorage`), so views, ``.data``, ``.detach()`` and ``nn.Parameter(t)``
share their tensor's place with no bookkeeping of their own. A move that changes the
place (``host.to(dev)``, ``dev.cpu()``) therefore returns a copy even where torch
would return the tensor itself (it is the same device here): as on CUDA, the host
tensor stays on the host.

Mixing is allowed only where CUDA allows it (`EXEMPT`, `_MOVES`): CPU scalars (0-dim
host tensors) as inputs of a device op; the moving and copying ops; indexing a device
tensor with a host index; metadata that only reads shapes. ``Tensor.numpy()`` of a
device tensor raises CUDA's TypeError; ``.item()`` and ``.tolist()`` work.

Limits: the mode sees the calls of the thread that entered it (and of the processes
forked from it: DataLoader workers); ops inside a torch function (the body of
``F.cross_entropy``, autograd hooks run by ``backward``) are checked as the one call
they make up; code that branches on ``device.type == "cpu"`` (or ``is_cuda``) takes the
CPU branch; ``"cpu"`` written out means the device, also where a library means the
host by it (``pack_padded_sequence``'s lengths); ``torch.load`` gives host tensors
whatever ``map_location`` says.

Use: ``with VirtualDevice(): ...`` in a test, or a whole process through
``tests/virtual_device/sitecustomize.py`` (``PYTHONPATH=tests/virtual_device`` and
``ESYNC_VIRTUAL_DEVICE=1``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["VirtualDevice", "MESSAGE", "EXEMPT", "HOST", "ACTIVE"]

#: the process-wide mode, where tests/virtual_device/sitecustomize.py entered one
ACTIVE: Optional["VirtualDevice"] = None

MESSAGE = ("Expected all tensors to be on the same device, but found at least two devices, "
           "cuda:0 and cpu! (virtual device: {op})")
NUMPY_MESSAGE = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to "
                 "copy the tensor to host memory first.")

#: Ops that may get host and device tensors together, and why (CUDA allows it). Ops
#: of one tensor (size, dim, numel, shape, dtype, device, __len__, is_floating_point,
#: item, tolist...) need no entry: they cannot mix. CPU scalars (0-dim host tensors as
#: inputs) are allowed in every op, as TensorIterator allows them on CUDA.
EXEMPT: Dict[str, str] = {
    # moves: the result is where the target says (the moved input's place does not matter)
    "to": "a move: the result is on the target's device (`x.to(tensor)`: the tensor's)",
    "cuda": "a move to the device",
    "cpu": "a move to the host",
    "type_as": "a move: `x.type_as(t)` converts x to t's type, device included",
    "copy_": "copies across devices (the destination keeps its place): "
             "`load_state_dict`, `p.copy_(host)`",
    "new_tensor": "`t.new_tensor(data)` copies data onto t's device",
    "data.__set__": "`param.data = t` moves the parameter to t's device "
                    "(Module.to, Module.cuda do that)",
    "_has_compatible_shallow_copy_type": "a metadata query of Module.to before "
                                         "`param.data = moved` (host param, moved copy)",
    # indexing: an index on the host is copied to the indexed tensor's device
    "__getitem__": "a device tensor indexed with a host index (a host tensor indexed with a "
                   "device index still fails, as on CUDA)",
    "__setitem__": "as __getitem__ for the index; the value is copied in (copy_ semantics)",
}

#: `name` of the moving ops and the target place they give their result
_MOVES = {"to", "cuda", "cpu", "type_as", "new_tensor"}

#: ops whose result keeps its storage's place: the destination of a copy keeps its own,
#: `t.data = u` and `t.set_(u)` take u's storage and so its place
_KEEP_PLACE = {"data.__set__", "set_", "copy_", "__setitem__", "_has_compatible_shallow_copy_type"}

_IN_PLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                     "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                     "__ilshift__", "__irshift__", "__imatmul__"}


def _name(func: Callable) -> str:
    """`add`, `__getitem__`, `data.__set__`, `linear`... the key of EXEMPT."""
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":  # a Tensor property: t.grad, t.data
        return f"{owner.__name__}.{func.__name__}"
    return getattr(func, "__name__", repr(func))


def _qualified(func: Callable) -> str:
    """The op's name for the error: Tensor.add, torch.embedding, Tensor.data.__set__."""
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":
        return f"Tensor.{owner.__name__}.{func.__name__}"
    name = getattr(func, "__qualname__", None) or _name(func)
    for internal, public in (("_VariableFunctionsClass.", "torch."), ("TensorBase.", "Tensor."),
                             ("_TensorBase.", "Tensor.")):
        if name.startswith(internal):
            return public + name[len(internal):]
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch") and "." not in name:
        return f"{module}.{name}"
    return name


def _tensors(value: Any, into: List[torch.Tensor]) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        into.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, into)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, into)
    return into


def _key(t: torch.Tensor) -> Any:
    """The object a place is kept on: the tensor's storage (shared by its views, `.data`,
    `.detach()`, `nn.Parameter(t)`), or the tensor itself where it has none (sparse)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return t


#: what `.device` of a host tensor returns: a `cpu` device like any other, but this very
#: object, so that `torch.arange(n, device=x.device)` or `y.to(x.device)` with x on the
#: host means the host (a `"cpu"` or `torch.device("cpu")` written out means the device)
HOST = torch.device("cpu")


def _target_device(value: Any) -> Optional[bool]:
    """Whether a `device=` argument names the device (cpu or cuda: True), the host or
    somewhere else (`HOST`, meta: False), or nothing (None)."""
    if value is None:
        return None
    if value is HOST:
        return False
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        return None
    return device.type in ("cpu", "cuda")


def _host_device(value: Any) -> Any:
    """`value` (a device argument) with cuda replaced by cpu, where the work runs."""
    try:
        if torch.device(value).type == "cuda":
            return torch.device("cpu")
    except (RuntimeError, TypeError):
        pass
    return value


class VirtualDevice(TorchFunctionMode):
    """CUDA's device rule on CPU tensors (see the module's docstring). `on_device(t)`
    says where a tensor is; `put(t)` puts one on the device."""

    def __init__(self) -> None:
        super().__init__()
        self._places: WeakIdKeyDictionary = WeakIdKeyDictionary()

    # --- places ------------------------------------------------------------------------
    def on_device(self, t: torch.Tensor) -> bool:
        return _key(t) in self._places

    def put(self, t: torch.Tensor) -> torch.Tensor:
        self._places[_key(t)] = True
        return t

    def _put_all(self, value: Any, unless: Tuple[torch.Tensor, ...] = ()) -> None:
        """Tag every tensor of an op's result, except those sharing a storage with one of
        `unless` (host inputs an op returned unchanged, as broadcast ops do)."""
        keep = {id(_key(t)) for t in unless}
        for t in _tensors(value, []):
            if id(_key(t)) not in keep:
                self.put(t)

    # --- the rule ----------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name in _MOVES:
            return self._move(func, name, args, kwargs)
        if name in ("numpy", "__array__"):
            if args and isinstance(args[0], torch.Tensor) and self.on_device(args[0]) \
                    and not kwargs.get("force", False):
                raise TypeError(NUMPY_MESSAGE)
            return func(*args, **kwargs)
        if name == "device.__get__":
            place = func(*args, **kwargs)
            if place.type == "cpu" and not self.on_device(args[0]):
                return HOST
            return place
        explicit = None
        if "device" in kwargs:
            explicit = _target_device(kwargs["device"])
            if explicit:
                kwargs = dict(kwargs, device=_host_device(kwargs["device"]))
        inputs = _tensors(args, [])
        _tensors(kwargs, inputs)
        device = [t for t in inputs if self.on_device(t)]
        host = [t for t in inputs if not self.on_device(t)]
        if device and host and name not in EXEMPT:
            self._check(func, name, args, kwargs, host)
        elif name in ("__getitem__", "__setitem__") and host and device:
            self._check_index(func, args)
        result = func(*args, **kwargs)
        if name in _KEEP_PLACE:
            return result
        if name == "__getitem__":
            if self.on_device(args[0]):
                self._put_all(result)
            return result
        if explicit:
            self._put_all(result, unless=tuple(host))
            for t in _tensors(result, []):  # a factory that returned its host input
                if not self.on_device(t):
                    return self._moved_copy(result)
        elif explicit is None and device:
            self._put_all(result, unless=tuple(host))
        return result

    def _check(self, func, name: str, args, kwargs, host: List[torch.Tensor]) -> None:
        """Host and device tensors in one op: fine only where every host tensor is a CPU
        scalar (0-dim) that the op reads, not one it writes (in place, or out=)."""
        written: List[torch.Tensor] = []
        if (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_DUNDERS:
            written += _tensors(args[:1], [])
        written += _tensors(kwargs.get("out"), [])
        if all(t.dim() == 0 and not any(t is w for w in written) for t in host):
            return
        raise RuntimeError(MESSAGE.format(op=_qualified(func)))

    def _check_index(self, func, args) -> None:
        """Indexing: the index may be on the host; a device index into a host tensor
        fails (CUDA: "indices should be either on cpu or on the same device")."""
        target = args[0]
        if self.on_device(target):
            return
        index = _tensors(args[1] if len(args) > 1 else (), [])
        if any(self.on_device(t) and t.dim() > 0 for t in index):
            raise RuntimeError(MESSAGE.format(op=_qualified(func)))

    def _move(self, func, name: str, args, kwargs):
        """to / cuda / cpu / type_as / new_tensor: the result goes where the target says;
        a change of place is a copy (torch returns the tensor itself for a move to the
        CPU: the host tensor would then be on the device too)."""
        source = args[0]
        if name == "cpu":
            where: Optional[bool] = False
        elif name == "cuda":  # cuda(device=None, non_blocking=False, memory_format=...)
            where = True  # one virtual device, whichever index: run as .to("cpu")
            kwargs = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
            func, args = torch.Tensor.to, (source, torch.device("cpu"))
        elif name == "type_as":
            where = self.on_device(args[1])
        elif name == "new_tensor":
            where = _target_device(kwargs.get("device"))
            if where is None:
                where = self.on_device(source)
            elif where:
                kwargs = dict(kwargs, device=_host_device(kwargs["device"]))
        else:  # to(device | tensor | dtype, ...)
            other = args[1] if len(args) > 1 else kwargs.get("other")
            if isinstance(other, torch.Tensor):
                where = self.on_device(other)
            else:
                if "device" in kwargs:
                    target = kwargs["device"]
                    if target is not None:
                        kwargs = dict(kwargs, device=_host_device(target))
                elif len(args) > 1 and not isinstance(args[1], torch.dtype):
                    target = args[1]
                    args = (source, _host_device(target)) + tuple(args[2:])
                else:
                    target = None
                where = _target_device(target)
                if where is None:
                    where = self.on_device(source)
        result = func(*args, **kwargs)
        if not isinstance(result, torch.Tensor):
            return result
        if where:
            if not self.on_device(result):
                result = self._moved_copy(result) if _key(result) is _key(source) else result
                self.put(result)
        elif self.on_device(result):
            result = result.clone()  # a copy to the host, as `.cpu()` of a CUDA tensor is
        return result

    def _moved_copy(self, result: Any) -> Any:
        """A copy of a host tensor a factory or a move returned unchanged (`as_tensor`,
        `.to("cpu")`), put on the device."""
        if isinstance(result, torch.Tensor):
            return self.put(result.clone())
        return result


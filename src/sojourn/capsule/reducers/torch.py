"""torch: tensors by storage (bytes out of band), devices in a side table, models, optimizers.

torch's own pickling copies every storage into the stream and writes devices into it. Here:

* **Storages** travel once each, whatever number of tensors use them: every tensor is
  ``(storage, dtype, offset, size, stride)`` and the storage is a per-pickler handle (keyed by
  its ``StorageImpl``; ``untyped_storage()`` may hand out a new Python object per call), so
  pickle's memo keeps views (``b = a[2:5]``) and tensors sharing a storage on one storage
  after restore. Bytes leave the stream as a buffer of kind ``"torch-storage"``: a CPU
  storage is exported in place (no copy); restore allocates the final storage first and reads
  the chunks straight into it. Non-CPU storages are copied to the host to be written.
* **Devices are not in the stream**, so fingerprints do not depend on where a tensor lived:
  the stream holds an index into ``CaptureContext.devices``. Restore maps every recorded
  device through :func:`map_device` (storages, ``torch.device`` values and generators alike)
  under the restore's ``device_policy``: ``"auto"`` (a GPU tensor goes back to a GPU of that
  kind if there is one, else to the CPU), ``"cpu"``, or ``"keep"`` (fail if it is missing).
  While a restore checks its fingerprints, objects remember the index they came from, so a
  tensor moved from ``cuda:0`` to the CPU still pickles as it was captured.
* **from_numpy**: a tensor whose memory belongs to a numpy array (``torch.from_numpy``)
  keeps sharing it when that array (or any view of it) is captured too, found among the
  namespace's variables and the objects pickled before the tensor; it is rebuilt with
  ``torch.from_numpy`` over the restored array. Otherwise it comes back owning a copy.
  (``t.numpy()`` arrays are numpy's side: they come back as arrays of their own.)
* **Supported**: every dtype (bytes are copied as bytes), strided and non-contiguous tensors,
  conj/neg views, ``requires_grad``, ``.grad``, tensor hooks and ``__dict__``, subclasses
  (``nn.Parameter`` keeps its type; user subclasses via ``_make_subclass``), sparse COO and
  compressed layouts, per-tensor/per-channel quantized tensors, meta tensors (no bytes),
  ``torch.Generator`` (the stream continues), ``torch.device``.
* **Refused, with the reason**: tensors with a ``grad_fn`` (they would silently become
  leaves), nested and mkldnn tensors, ``__torch_dispatch__`` wrapper subclasses (FakeTensor,
  DTensor, functorch wrappers), lazy modules' uninitialized parameters, storage-less devices.
* Not restored: autograd view links (``._base``; storage sharing is kept), inference-mode
  flags, and the wrapper an LR scheduler puts on ``optimizer.step`` only to warn about call
  order. Optimizer hooks travel (torch's ``__getstate__`` drops them), and restored hook
  ids move ``RemovableHandle.next_id`` past them, so a new hook cannot replace an old one.

Nothing here imports torch at import time: reducers run only on torch objects (so torch is
in ``sys.modules``); reconstructors and the allocator import it.
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import sys
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sojourn.capsule.context import current, current_or_none
from sojourn.capsule.pickler import PROTOCOL
from sojourn.capsule.registry import register, register_allocator
from sojourn.errors import RestoreError

POLICIES = ("auto", "cpu", "keep")


def _torch() -> Any:
    mod = sys.modules.get("torch")
    if mod is None:
        import torch as mod
    return mod


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# -- the device policy: one function for storages, torch.device values and generators ------


def _device_count(torch: Any, kind: str) -> int:
    mod = getattr(torch, kind, None)
    try:
        if mod is None or not mod.is_available():
            return 0
        return int(mod.device_count()) if hasattr(mod, "device_count") else 1
    except Exception:  # a backend that is compiled in but cannot start counts as absent
        return 0


def map_device(recorded: str, policy: str = "auto") -> str:
    """Where something captured on ``recorded`` goes on this machine under ``policy``."""
    if policy not in POLICIES:
        raise RestoreError(f"device_policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    torch = _torch()
    dev = torch.device(recorded)
    if dev.type in ("cpu", "meta"):
        return recorded
    if policy == "cpu":
        return "cpu"
    count = _device_count(torch, dev.type)
    if count and (dev.index is None or dev.index < count):
        return recorded
    if policy == "keep":
        have = f"{count} {dev.type} device(s)" if count else f"no {dev.type} device"
        raise RestoreError(
            f"the capsule holds tensors on {recorded} and this machine has {have}; with "
            "device_policy='keep' nothing is moved. Restore with device_policy='auto' (same "
            "kind of device if present, else the CPU) or 'cpu'"
        )
    if not count:
        return "cpu"
    return f"{dev.type}:{dev.index % count}"  # index past the last device: wrap around


@dataclass
class _RestoreState:
    """What one restore remembers so that re-pickling its objects gives the captured stream."""

    storage_slots: dict[int, int] = field(default_factory=dict)  # StorageImpl -> device slot
    object_slots: dict[int, int] = field(default_factory=dict)  # id(device/generator) -> slot
    canonical: dict[int, Any] = field(default_factory=dict)  # id -> captured reduce value
    targets: dict[int, str] = field(default_factory=dict)  # slot -> device chosen here


def _restore_state() -> _RestoreState | None:
    rctx = current_or_none()
    if rctx is None:
        return None
    # RestoreContext.canonical is keyed by id; this class's id is one nobody else uses.
    st = rctx.canonical.get(id(_RestoreState))
    if st is None:
        st = rctx.canonical[id(_RestoreState)] = _RestoreState()
    return st  # type: ignore[no-any-return]


def _target(slot: int) -> str:
    rctx = current()
    st = _restore_state()
    assert st is not None
    found = st.targets.get(slot)
    if found is not None:
        return found
    try:
        recorded = rctx.devices[slot]
    except IndexError:
        raise RestoreError(f"the capsule names device #{slot} but its device table has {len(rctx.devices)}") from None
    target = map_device(recorded, rctx.device_policy)
    if target != recorded:
        rctx.warnings.append(
            f"torch objects captured on {recorded} were restored on {target} "
            f"(device_policy={rctx.device_policy!r})"
        )
    st.targets[slot] = target
    return target


def _remember(obj: Any, slot: int, *, storage: bool = False) -> None:
    rctx, st = current(), _restore_state()
    assert st is not None
    rctx.keepalive.append(obj)  # ids and StorageImpl addresses stay unique while checked
    if storage:
        st.storage_slots[obj._cdata] = slot
    else:
        st.object_slots[id(obj)] = slot


# -- per-pickler state ------------------------------------------------------------------------


@dataclass
class _StorageHandle:
    """The one object that stands for a storage in one stream (pickle memoizes it)."""

    storage: Any
    slot: int  # index in the device table; -1 for memory lent by numpy (always the CPU)
    nbytes: int
    on_host: bool
    numpy_cover: tuple[Any, int] | None  # (numpy root array, byte offset) for from_numpy memory


@dataclass
class _PicklerState:
    restore: _RestoreState | None
    handles: dict[int, _StorageHandle] = field(default_factory=dict)
    roots: dict[int, tuple[int, int, Any]] | None = None  # numpy roots that may lend memory
    buffers_seen: int = 0  # pickler.buffers already searched for such roots


def _state(pickler: Any) -> _PicklerState:
    st = pickler.__dict__.get("_sojourn_torch")
    if st is None:
        restore = _restore_state() if pickler.ctx.fingerprint_only else None
        if restore is not None and not pickler.ctx.devices:
            pickler.ctx.devices.extend(current().devices)
        st = pickler.__dict__["_sojourn_torch"] = _PicklerState(restore)
    return st  # type: ignore[no-any-return]


def _slot(pickler: Any, device: str) -> int:
    devices: list[str] = pickler.ctx.devices
    if device not in devices:
        devices.append(device)
    return devices.index(device)


def _object_slot(pickler: Any, obj: Any, device: str) -> int:
    st = _state(pickler)
    if st.restore is not None and id(obj) in st.restore.object_slots:
        return st.restore.object_slots[id(obj)]
    return _slot(pickler, device)


# -- storages ---------------------------------------------------------------------------------


def _storage_device(storage: Any) -> str:
    return str(storage.device)


def _handle(pickler: Any, storage: Any) -> _StorageHandle:
    st = _state(pickler)
    key = storage._cdata
    h = st.handles.get(key)
    if h is None:
        on_host = storage.device.type == "cpu"
        cover = _numpy_cover(pickler, storage) if on_host else None
        slot = st.restore.storage_slots.get(key) if st.restore is not None else None
        if slot is None:
            slot = -1 if cover is not None else _slot(pickler, _storage_device(storage))
        h = st.handles[key] = _StorageHandle(storage, slot, storage.nbytes(), on_host, cover)
    return h


def _byte_array(storage: Any) -> Any:
    """A writable uint8 array over a CPU storage's memory; it keeps the storage alive."""
    # Not via .numpy(): that marks the storage as not resizable, for good, and that both
    # changes the user's tensor and sends later captures down _numpy_cover's slow path.
    arr = (ctypes.c_ubyte * storage.nbytes()).from_address(storage.data_ptr())
    arr._sojourn_owner = storage  # type: ignore[attr-defined]
    return arr


def _add_roots(roots: dict[int, tuple[int, int, Any]], objs: Iterable[Any], np: Any) -> None:
    for arr in objs:
        if not isinstance(arr, np.ndarray):
            continue
        root = arr
        while isinstance(root.base, np.ndarray):
            root = root.base
        # The numpy reducer rebuilds a contiguous root with the same layout, so byte offsets
        # into it hold after restore; other roots travel as copies.
        if id(root) in roots or root.dtype.hasobject or not (root.flags.c_contiguous or root.flags.f_contiguous):
            continue
        lo = int(root.__array_interface__["data"][0])
        roots[id(root)] = (lo, lo + root.nbytes, root)


def _find_root(roots: dict[int, tuple[int, int, Any]], start: int, end: int) -> tuple[Any, int] | None:
    for lo, hi, root in roots.values():
        if lo <= start and end <= hi:
            return root, start - lo
    return None


def _numpy_cover(pickler: Any, storage: Any) -> tuple[Any, int] | None:
    # torch allocates resizable storages; memory lent by numpy (from_numpy) is not resizable.
    np = sys.modules.get("numpy")
    if np is None or storage.resizable() or storage.nbytes() == 0:
        return None
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    st = _state(pickler)
    if st.roots is None:
        st.roots = {}
        _add_roots(st.roots, (pickler.ctx.namespace or {}).values(), np)
    found = _find_root(st.roots, start, end)
    if found is None and st.buffers_seen < len(pickler.buffers):
        # Arrays pickled before this tensor, nested anywhere: each root went out of band
        # (its buffer's owner is a view of it), so the buffers not looked at yet hold the
        # rest. Each buffer is looked at once per capture, not the whole memo per tensor.
        new = pickler.buffers[st.buffers_seen :]
        st.buffers_seen = len(pickler.buffers)
        _add_roots(st.roots, (b.owner for b in new), np)
        found = _find_root(st.roots, start, end)
    return found


@register(f"{__name__}._StorageHandle")
def _handle_reduce(h: _StorageHandle, pickler: Any) -> Any:
    if h.numpy_cover is not None:
        root, offset = h.numpy_cover
        return (_storage_from_numpy, (root, offset, h.nbytes))
    if h.nbytes == 0 or h.storage.device.type == "meta":
        return (_make_storage, (h.nbytes, h.slot))  # nothing to carry but the size
    host = h.storage if h.on_host else h.storage.cpu()
    buf = pickler.out_of_band(_byte_array(host), "torch-storage", {"nbytes": h.nbytes})
    return (_make_storage, (buf, h.slot))


@register("torch.storage.UntypedStorage")
def _untyped_storage_reduce(s: Any, pickler: Any) -> Any:
    pickler.note_module("torch")
    return (_identity, (_handle(pickler, s),))


@register("torch.storage.TypedStorage", subclasses=True)
def _typed_storage_reduce(s: Any, pickler: Any) -> Any:
    pickler.note_module("torch")
    return (_make_typed_storage, (_handle(pickler, s._untyped_storage), _dtype_name(s.dtype)))


@register_allocator("torch-storage")
def _allocate_storage(meta: dict[str, Any], size: int) -> tuple[Any, memoryview]:
    if int(meta.get("nbytes", size)) != size:
        raise ValueError(f"torch storage buffer is {size} bytes but its record says {meta['nbytes']}")
    storage = _torch().UntypedStorage(size)  # uninitialised: the chunks fill all of it
    return storage, memoryview(_byte_array(storage)).cast("B")


def _identity(obj: Any) -> Any:
    return obj


def _make_storage(data: Any, slot: int) -> Any:
    torch = _torch()
    target = _target(slot)
    if isinstance(data, int):
        storage = torch.UntypedStorage(data, device=target)
    else:
        storage = data if target == "cpu" else data.to(device=torch.device(target))
    _remember(storage, slot, storage=True)
    return storage


def _storage_from_numpy(root: Any, offset: int, nbytes: int) -> Any:
    np = sys.modules["numpy"]  # the unpickler rebuilt ``root`` just before
    flat = (root if root.flags.c_contiguous else root.T).reshape(-1).view(np.uint8)
    return _torch().from_numpy(flat[offset : offset + nbytes]).untyped_storage()


def _make_typed_storage(storage: Any, dtype: str) -> Any:
    torch = _torch()
    return torch.TypedStorage(wrap_storage=storage, dtype=getattr(torch, dtype), _internal=True)


# -- tensors ----------------------------------------------------------------------------------

_COMPRESSED = ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")


def _refusal(t: Any, torch: Any) -> str | None:
    cls = type(t)
    if getattr(cls, "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__:
        return (
            f"{cls.__qualname__} is a tensor subclass with its own __torch_dispatch__ (a wrapper "
            "such as FakeTensor, DTensor or FunctionalTensor holds no storage of its own); "
            "convert it to a plain tensor before capture"
        )
    if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
        return (
            "it is an uninitialized parameter of a lazy module (LazyLinear, ...); run one "
            "forward pass so that it gets its shape, then capture"
        )
    functorch = getattr(torch._C, "_functorch", None)
    if functorch is not None and functorch.is_functorch_wrapped_tensor(t):
        return "it is a tensor inside a vmap/grad transform; capture outside the transform"
    if t.grad_fn is not None:
        return (
            f"it is part of an autograd graph (grad_fn={type(t.grad_fn).__name__}) and would "
            "silently come back as a leaf cut off from that graph; capture t.detach() instead, "
            "or capture after backward() when the graph is no longer needed"
        )
    if t.is_nested:
        return "nested tensors are not supported; capture t.unbind() (a tuple of tensors) instead"
    layout = str(t.layout).removeprefix("torch.")
    if layout not in ("strided", "sparse_coo", *_COMPRESSED):
        return f"tensors with layout {layout} are not supported; capture t.to_dense() instead"
    if layout != "strided" and cls is not torch.Tensor:
        return f"sparse tensor subclasses ({cls.__qualname__}) are not supported"
    if layout == "strided" and t.device.type not in ("cpu", "meta") and not torch._C._has_storage(t):
        return f"tensors on {t.device} have no storage that can be read; move it with t.cpu() first"
    if t.is_quantized and _dtype_name(t.qscheme()) not in _QSCHEMES:
        return f"quantized tensors with scheme {t.qscheme()} are not supported; capture t.dequantize()"
    return None


_QSCHEMES = ("per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams")


def _extra(t: Any, torch: Any) -> dict[str, Any] | None:
    # conj/neg bits: lazily conjugated or negated views share their base's memory.
    extra: dict[str, Any] = dict(torch._C._get_tensor_metadata(t))
    if t.is_quantized:
        scheme = _dtype_name(t.qscheme())
        if scheme == "per_tensor_affine":
            extra["q"] = (scheme, t.q_scale(), t.q_zero_point())
        else:
            extra["q"] = (scheme, t.q_per_channel_scales(), t.q_per_channel_zero_points(), t.q_per_channel_axis())
    return extra or None


def _tensor_state(t: Any, cls: Any, torch: Any) -> dict[str, Any] | None:
    state: dict[str, Any] = {}
    if t.grad is not None:
        state["grad"] = t.grad
    if t._backward_hooks:
        state["hooks"] = t._backward_hooks
    post = getattr(t, "_post_accumulate_grad_hooks", None)
    if post:
        state["post_hooks"] = post
    if t.__dict__:
        state["dict"] = t.__dict__
    if cls is not torch.Tensor:
        slots = {n: getattr(t, n) for n in copyreg._slotnames(cls) if hasattr(t, n)}  # type: ignore[attr-defined]
        if slots:
            state["slots"] = slots
    return state or None


@register("torch.Tensor", subclasses=True)
def _tensor_reduce(t: Any, pickler: Any) -> Any:
    torch = sys.modules["torch"]
    pickler.note_module("torch")
    reason = _refusal(t, torch)
    if reason is not None:
        return pickler.problem(t, reason)
    cls = type(t)
    sub = None if cls is torch.Tensor else cls
    layout = str(t.layout).removeprefix("torch.")
    if layout == "strided":
        storage = _handle(pickler, t.untyped_storage())
        args: tuple[Any, ...] = (
            storage, _dtype_name(t.dtype), t.storage_offset(), tuple(t.shape), t.stride(),
            t.requires_grad, sub, _extra(t, torch),
        )
        rv: tuple[Any, ...] = (_make_tensor, args)
    elif layout == "sparse_coo":
        coo = (t._indices().detach(), t._values().detach(), tuple(t.shape), t.is_coalesced(), t.requires_grad)
        rv = (_make_sparse_coo, coo)
    else:
        if layout in ("sparse_csr", "sparse_bsr"):
            compressed, plain = t.crow_indices(), t.col_indices()
        else:
            compressed, plain = t.ccol_indices(), t.row_indices()
        parts = (compressed.detach(), plain.detach(), t.values().detach())
        rv = (_make_sparse_compressed, (layout, *parts, tuple(t.shape), t.requires_grad))
    state = _tensor_state(t, cls, torch)
    if state is None:
        return rv
    return (*rv, state, None, None, _tensor_setstate)


def _make_tensor(
    storage: Any,
    dtype: str,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    cls: Any,
    extra: dict[str, Any] | None,
) -> Any:
    torch = _torch()
    dt = getattr(torch, dtype)
    extra = extra or {}
    q = extra.get("q")
    if q is None:
        t = torch.empty(0, dtype=dt, device=storage.device)
    else:
        with _quiet():  # torch's deprecation warning was shown when the user made it
            if q[0] == "per_tensor_affine":
                t = torch._empty_affine_quantized([0], scale=q[1], zero_point=q[2], dtype=dt, device=storage.device)
            else:
                t = torch._empty_per_channel_affine_quantized(
                    [0], scales=q[1], zero_points=q[2], axis=q[3], dtype=dt, device=storage.device
                )
    t.set_(storage, offset, size, stride)
    bits = {k: v for k, v in extra.items() if k != "q"}
    if bits:
        torch._C._set_tensor_metadata(t, bits)
    if cls is not None:
        return torch.Tensor._make_subclass(cls, t, requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _make_sparse_coo(indices: Any, values: Any, size: tuple[int, ...], coalesced: bool, requires_grad: bool) -> Any:
    t = _torch().sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=False)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _make_sparse_compressed(
    layout: str, compressed: Any, plain: Any, values: Any, size: tuple[int, ...], requires_grad: bool
) -> Any:
    torch = _torch()
    with _quiet():  # "sparse CSR support is in beta": shown when the user made it
        t = torch.sparse_compressed_tensor(
            compressed, plain, values, size, layout=getattr(torch, layout), check_invariants=False
        )
    return t.requires_grad_(requires_grad) if requires_grad else t


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _tensor_setstate(t: Any, state: dict[str, Any]) -> None:
    if "grad" in state:
        t.grad = state["grad"]
    if "hooks" in state:
        t._backward_hooks = state["hooks"]
        _bump_hook_ids([state["hooks"]])
    if "post_hooks" in state:
        t._post_accumulate_grad_hooks = state["post_hooks"]
        _bump_hook_ids([state["post_hooks"]])
    if "dict" in state:
        t.__dict__.update(state["dict"])
    for name, value in state.get("slots", {}).items():
        setattr(t, name, value)


# -- torch.device and torch.Generator ----------------------------------------------------------


@register("torch.device")
def _device_reduce(dev: Any, pickler: Any) -> Any:
    pickler.note_module("torch")
    return (_make_device, (_object_slot(pickler, dev, str(dev)),))


def _make_device(slot: int) -> Any:
    dev = _torch().device(_target(slot))
    _remember(dev, slot)
    return dev


def _default_generators(torch: Any) -> list[tuple[str, Any]]:
    found = [("cpu", torch.default_generator)]
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        found += [(f"cuda:{i}", g) for i, g in enumerate(cuda.default_generators)]
    return found


@register("torch._C.Generator")
def _generator_reduce(g: Any, pickler: Any) -> Any:
    torch = sys.modules["torch"]
    pickler.note_module("torch")
    st = _state(pickler)
    if st.restore is not None and id(g) in st.restore.canonical:
        return st.restore.canonical[id(g)]
    for device, default in _default_generators(torch):
        if g is default:
            # Its state is process state: the capsule's process segment carries it.
            return (_default_generator, (_object_slot(pickler, g, device),))
    state = g.get_state()
    raw = ctypes.string_at(state.data_ptr(), state.numel())
    return (_make_generator, (_object_slot(pickler, g, str(g.device)), raw, g.initial_seed()))


def _default_generator(slot: int) -> Any:
    torch = _torch()
    dev = torch.device(_target(slot))
    if dev.type == "cuda":
        torch.cuda.init()  # default_generators is empty until CUDA is initialised
        g = torch.cuda.default_generators[dev.index or 0]
    else:
        g = torch.default_generator
    _remember(g, slot)
    return g


def _make_generator(slot: int, state: bytes, seed: int) -> Any:
    torch = _torch()
    rctx = current()
    target = torch.device(_target(slot))
    g = torch.Generator(device=target)
    if target.type == torch.device(rctx.devices[slot]).type:
        g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    else:
        # CPU and GPU generators are different algorithms: the stream cannot continue.
        g.manual_seed(seed)
        rctx.warnings.append(
            f"a torch.Generator from {rctx.devices[slot]} now lives on {target}; another kind "
            f"of device draws other numbers, so it was re-seeded with its initial seed {seed}"
        )
        st = _restore_state()
        assert st is not None
        st.canonical[id(g)] = (_make_generator, (slot, state, seed))
    _remember(g, slot)
    return g


# -- modules and optimizers: their own pickling, plus hooks and hook ids ------------------------


def _bump_hook_ids(dicts: Iterable[Any]) -> None:
    # RemovableHandle ids restart at 0 in a new process: a hook registered after restore
    # would take a restored hook's id and silently replace it in the same dict.
    top = max((k for d in dicts for k in d if isinstance(k, int)), default=-1)
    if top >= 0:
        from torch.utils.hooks import RemovableHandle

        RemovableHandle.next_id = max(RemovableHandle.next_id, top + 1)


def _setstate_with_hooks(obj: Any, state: dict[str, Any]) -> None:
    obj.__setstate__(state)
    _bump_hook_ids(v for k, v in state.items() if k.endswith("hooks") and isinstance(v, dict))


@register("torch.nn.modules.module.Module", "torch.optim.optimizer.Optimizer", subclasses=True)
def _hooked_reduce(obj: Any, pickler: Any) -> Any:
    pickler.note_module(type(obj).__module__)
    try:
        rv = obj.__reduce_ex__(PROTOCOL)
    except Exception as e:
        return pickler.problem(obj, f"its own pickling fails: {str(e) or type(e).__name__}")
    if not (isinstance(rv, tuple) and len(rv) in (3, 4, 5) and isinstance(rv[2], dict)):
        return rv
    if not hasattr(obj, "__setstate__"):
        return rv
    # Keys as the instance dict holds them: __setstate__ stores the stream's strings there,
    # so a restored object pickles again with the very string objects it was rebuilt from
    # (a fresh literal key would break the stream's sharing of that string; see pickler.py).
    keys = {k: k for k in vars(obj)}
    state = {keys.get(k, k): v for k, v in rv[2].items()}
    torch = sys.modules["torch"]
    if isinstance(obj, torch.optim.Optimizer):
        # Optimizer.__getstate__ keeps only defaults, state and param_groups.
        hooks = {k: v for k, v in vars(obj).items() if k.startswith("_optimizer_") and k.endswith("hooks") and v}
        state = {**state, **hooks}
    rest = (*rv[3:], None, None)[:2]
    return (rv[0], rv[1], state, *rest, _setstate_with_hooks)

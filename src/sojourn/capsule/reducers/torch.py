"""torch: storages (bytes out of band) and devices (in a side table); the family's front.

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

Tensors over these storages are in :mod:`sojourn.capsule.reducers.torch_tensors`;
``torch.device``, generators, modules and optimizers in
:mod:`sojourn.capsule.reducers.torch_objects`. Importing this module registers all three.

Nothing here imports torch at import time: reducers run only on torch objects (so torch is
in ``sys.modules``); reconstructors and the allocator import it.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sojourn.capsule.context import current, current_or_none
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
    if sys.byteorder != "little":
        # Capsules are little-endian (numpy_order); a storage does not know its element size.
        return pickler.problem(h.storage, "torch tensors cannot be written to a capsule on a big-endian "
                               "machine yet (sojourn does not swap torch storages); use numpy arrays there")
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


# The tensor, device, generator, module and optimizer reducers import the helpers above.
from sojourn.capsule.reducers.torch_objects import (  # noqa: E402
    _default_generator,
    _make_device,
    _make_generator,
    _setstate_with_hooks,
)
from sojourn.capsule.reducers.torch_tensors import (  # noqa: E402
    _make_sparse_compressed,
    _make_sparse_coo,
    _make_tensor,
    _tensor_setstate,
)

# A capsule names each reconstructor by module and qualname, and a restore pickles what it
# rebuilt again and compares the bytes with the capture's: the reconstructors that moved to
# those modules keep the name they had here, so capsules written before the move restore
# (and pass that check) as before.
for _fn in (
    _make_tensor,
    _make_sparse_coo,
    _make_sparse_compressed,
    _tensor_setstate,
    _make_device,
    _default_generator,
    _make_generator,
    _setstate_with_hooks,
):
    _fn.__module__ = __name__
del _fn

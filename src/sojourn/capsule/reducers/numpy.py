"""numpy arrays: bytes out of band, views kept as views of their base.

Plain pickle copies every view into an array of its own, so ``b = a[2:5]`` stops sharing
memory with ``a``. Here every array is reduced relative to its *root*, the ndarray at the
end of its ``.base`` chain:

* a root that owns C- or Fortran-contiguous memory travels as one out-of-band buffer of
  kind ``"ndarray"``; restore allocates the owning array (right dtype, shape and order)
  before unpickling and reads the chunks straight into it;
* every other array travels as ``(root, byte offset, shape, strides, dtype)`` and comes back
  as ``np.ndarray(buffer=root, ...)``, whose ``.base`` is the restored root.

Byte order (:mod:`sojourn.capsule.reducers.numpy_order`): buffers and dtype strings are
little-endian on every machine; a big-endian machine swaps a copy on the way out and the
restored array in place on the way in, so a native array comes back native anywhere.

Memory-mapped arrays come back as ordinary arrays. A root whose memory belongs to something
else (``np.frombuffer(bytes)``, an ``mmap``) and is not contiguous travels as a contiguous
copy, and its views as copies too; that case is rare and documented.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sojourn.capsule.reducers import numpy_masked as masked
from sojourn.capsule.reducers import numpy_order as endian
from sojourn.capsule.registry import register, register_allocator


def _np() -> Any:
    return sys.modules["numpy"]


# numpy advises transparent huge pages for every array of 4 MiB and more. A restore makes the
# whole state at once, and the kernel must then find and zero 2 MiB blocks of memory nothing
# has touched yet: on the 2-CPU VM this was measured on, first-touch huge pages cost 1.6-3 s
# of system time per GiB against 0.5 s for 4 KiB pages, and a cold 1 GiB restore swung
# between 0.64 and 1.38 s (0.56-0.65 s without the advice). Restored arrays keep 4 KiB pages
# (no difference measured on streaming or gather over 1 GiB; khugepaged may still merge them
# later); arrays the program makes afterwards get numpy's advice as before.
# SOJOURN_RESTORE_HUGEPAGES=1 keeps numpy's advice for restored arrays too.
_PAGES_LOCK = threading.Lock()
_PAGES_DEPTH = [0, True]  # nested users (a prefetch thread and the restore), numpy's setting


@contextmanager
def small_pages(wanted: bool = True) -> Iterator[None]:
    """Allocate arrays without numpy's huge-page advice inside the block."""
    switch = None
    if wanted and os.environ.get("SOJOURN_RESTORE_HUGEPAGES", "") in ("", "0"):
        np = _np() if "numpy" in sys.modules else __import__("numpy")  # the arrays need it anyway
        core = getattr(np, "_core", None) or getattr(np, "core", None)
        mod = getattr(core, "multiarray", None)
        get, put = (getattr(mod, "_get_madvise_hugepage", None), getattr(mod, "_set_madvise_hugepage", None))
        switch = (get, put) if callable(get) and callable(put) else None  # else: numpy's default
    if switch is None:
        yield
        return
    with _PAGES_LOCK:
        if _PAGES_DEPTH[0] == 0:
            _PAGES_DEPTH[1] = bool(switch[0]())
            switch[1](False)
        _PAGES_DEPTH[0] += 1
    try:
        yield
    finally:
        with _PAGES_LOCK:
            _PAGES_DEPTH[0] -= 1
            if _PAGES_DEPTH[0] == 0:
                switch[1](_PAGES_DEPTH[1])


def _from_descr(descr: Any) -> Any:
    np = _np()
    if isinstance(descr, list):
        descr = [tuple(x) if isinstance(x, list) else x for x in descr]
        descr = [(*d[:1], _fix(d[1]), *d[2:]) for d in descr]
    return np.lib.format.descr_to_dtype(descr)


def _fix(x: Any) -> Any:
    # JSON turns nested tuples into lists; descr_to_dtype wants tuples for sub-arrays.
    if isinstance(x, list):
        if x and all(isinstance(i, list) and len(i) >= 2 and isinstance(i[0], str) for i in x):
            return [(i[0], _fix(i[1]), *[tuple(j) if isinstance(j, list) else j for j in i[2:]]) for i in x]
        return tuple(_fix(i) for i in x)
    return x


def _root(arr: Any, pickler: Any) -> Any:
    np = _np()
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is not arr and masked.is_masked(root):
        # A masked array that owns its memory is rebuilt as a view of a plain array: that
        # array is the root, for it and for every view of it (numpy_masked.py).
        return masked.owned_root(root, pickler)
    return root


def _address(arr: Any) -> int:
    return int(arr.__array_interface__["data"][0])


def _contiguous_order(arr: Any) -> str | None:
    if arr.flags.c_contiguous:
        return "C"
    if arr.flags.f_contiguous:
        return "F"
    return None


# -- reconstructors (called by the unpickler) ----------------------------------------------


def _ndarray_root(arr: Any) -> Any:
    # The allocator already built the owning array and read the chunks into it; pickle
    # hands it back here, once, before anything else sees it (a read-only array's buffer
    # arrives as a read-only memoryview of it). The chunks are little-endian: a big-endian
    # machine swaps the native leaves in place.
    readonly = isinstance(arr, memoryview)
    if readonly:
        arr = arr.obj
    if not endian.LITTLE and arr.size:
        endian.swap_in_place(arr, endian.native_paths(arr.dtype))
    if readonly:
        arr.flags.writeable = False
    return arr


def _ndarray_view(root: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> Any:
    # Works for object dtypes too: the view borrows the root's references, and its .base
    # is the root, which keeps them alive.
    dtype = endian.rebase(dtype, root, offset)
    return _np().ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)


def _ndarray_empty_objects(dtype: Any, shape: tuple[int, ...], order: str) -> Any:
    return _np().empty(shape, dtype=dtype, order=order)


def _ndarray_fill_objects(arr: Any, items: list[Any]) -> None:
    flat = _np().ravel(arr, order="K")
    for i, item in enumerate(items):
        flat[i] = item


# -- the reducer ------------------------------------------------------------------------------


def _roots(pickler: Any) -> dict[int, tuple[Any, dict[str, Any], bool]]:
    """Roots this capture wrote: id -> (root, its buffer meta, whether it swapped bytes)."""
    found = getattr(pickler, "_sj_roots", None)
    if found is None:
        found = pickler._sj_roots = {}
    return found


def _reinterpreted(arr: Any, root: Any, pickler: Any) -> Any:
    """``arr`` sees ``root``'s bytes through another layout: both keep this machine's order.

    Returns the dtype the view travels with, or a problem placeholder."""
    done = _roots(pickler).get(id(root))
    if done is None:
        pending = getattr(pickler, "_sj_force", None)
        if pending is None:
            pending = pickler._sj_force = set()
        pending.add(id(root))
    elif done[2]:
        return None  # a big-endian machine already wrote it swapped: see the caller
    else:
        descr, explicit = endian.encode_descr(root.dtype, pickler, force=True)
        done[1]["dtype"] = descr
        if explicit:
            done[1]["explicit"] = explicit
    return endian.explicit_copy(arr.dtype, pickler)


@register("numpy.ndarray", "numpy.memmap", subclasses=not endian.LITTLE)
def _ndarray_reduce(arr: Any, pickler: Any) -> Any:
    np = _np()
    pickler.note_module("numpy")
    if not endian.LITTLE and type(arr) is not np.ndarray and not isinstance(arr, np.memmap):
        return endian.reduce_subclass_big(arr, pickler)
    root = _root(arr, pickler)
    shareable = root.base is None or _contiguous_order(root) is not None
    if arr is not root and shareable:
        offset = _address(arr) - _address(root)
        if arr.dtype.hasobject or endian.consistent(arr, root, offset, pickler):
            dtype = endian.origin(arr.dtype)
        else:
            dtype = _reinterpreted(arr, root, pickler)
            if dtype is None:
                return pickler.problem(arr, (
                    "it reinterprets the bytes of an array pickled before it (as "
                    f"{arr.dtype} over {root.dtype}); on a big-endian machine such a view can "
                    "only travel when it comes first: put it before its base in the "
                    "namespace, or make it a copy"))
        return (_ndarray_view, (root, offset, arr.shape, arr.strides, dtype))
    # ``arr`` is a root (or a view whose root cannot be shared: it travels as a copy).
    root = arr if arr is root else None
    layout = _contiguous_order(arr)
    if layout is None:
        arr = np.ascontiguousarray(arr)
        layout = "C"
    if type(arr) is not np.ndarray:
        arr = arr.view(np.ndarray)  # memmap and friends come back as plain arrays
    if arr.dtype.hasobject:
        return (
            _ndarray_empty_objects,
            (arr.dtype, arr.shape, layout),
            list(np.ravel(arr, order="K")),
            None,
            None,
            _ndarray_fill_objects,
        )
    force = id(arr) in (getattr(pickler, "_sj_force", None) or ())
    descr, explicit = endian.encode_descr(arr.dtype, pickler, force=force)
    meta: dict[str, Any] = {"dtype": descr, "shape": list(arr.shape), "order": layout}
    if explicit:
        meta["explicit"] = explicit
    if endian.has_longdouble(arr.dtype):
        meta["longdouble"] = endian.longdouble_format()
    swap = [] if endian.LITTLE or force or not arr.size else endian.native_paths(arr.dtype, pickler)
    if swap:
        # The capsule is little-endian: swap a copy, never the program's array; the copy says
        # read-only when the array does (pickle then marks the buffer read-only).
        writeable = arr.flags.writeable
        arr = arr.copy(order="K")
        endian.swap_in_place(arr, swap)
        arr.flags.writeable = writeable
    _roots(pickler)[id(root if root is not None else arr)] = (arr, meta, bool(swap))
    # Bytes, not elements: datetimes and some other dtypes do not export a buffer.
    raw = (arr.T if layout == "F" else arr).reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
    return (_ndarray_root, (pickler.out_of_band(raw, "ndarray", meta),))


@register_allocator("ndarray")
def _allocate_ndarray(meta: dict[str, Any], size: int) -> tuple[Any, memoryview]:
    np = _np() if "numpy" in sys.modules else __import__("numpy")
    endian.check_longdouble(meta.get("longdouble"), "the capsule")
    arr = np.empty(tuple(meta["shape"]), dtype=endian.decode_descr(meta["dtype"], meta.get("explicit")),
                   order=meta["order"])
    mem = arr.T if meta["order"] == "F" else arr
    view = memoryview(mem.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
    if len(view) != size:
        raise ValueError(f"array buffer is {size} bytes but dtype and shape give {len(view)}")
    return arr, view

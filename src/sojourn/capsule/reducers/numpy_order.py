"""Byte order of numpy values in a capsule: little-endian on every machine.

A capsule is written as a little-endian machine writes it, wherever it is written: the
chunks of an ``int32`` array, the bytes of a numpy scalar and the dtype strings in the
stream and the manifest are the same on x86_64, arm64 and s390x, and so are the
fingerprints. A big-endian machine converts on the way out (a swapped copy of each array,
only there) and on the way in (restored arrays are swapped in place before anything sees
them), so a capsule taken on x86_64 and checked on s390x compares equal byte for byte.

What a restored array looks like: the program's arrays are *native* (``'<i4'`` on x86_64,
``'>i4'`` on s390x) and come back native on any machine, with the same values. A byte
order the program asked for (``np.dtype('>f8')``, read from a big-endian file format) is
*explicit* and comes back as that order. Each leaf of a dtype (a field, a subarray's
base, or the dtype itself) is in one of three states:

=====  =====================================  =================================
state  meaning                                written as
=====  =====================================  =================================
N      native (the machine's own order)       ``<``
L      explicitly little-endian               ``<``, its index in ``explicit``
B      explicitly big-endian                  ``>``
=====  =====================================  =================================

On a machine where an explicit order is also the native one (``'>f8'`` restored on s390x),
numpy cannot tell it from a native dtype: the restored dtype object is a fresh one that
this module remembers (:data:`_EXPLICIT`), so that a capsule taken there says "explicit"
again and a move back keeps the program's order.

A view that reinterprets its base's bytes (``a.view(np.uint8)``, ``raw.view(np.float32)``)
sees a byte order: it stays faithful only if the memory keeps the order it had. Such a
root and its views travel explicit, in the order of the machine that wrote the capsule.
"""

from __future__ import annotations

import math
import sys
from typing import Any

LITTLE = sys.byteorder == "little"
NATIVE_CHAR = "<" if LITTLE else ">"

# dtype objects whose native order is explicit (see above), by id; the value keeps the id
# unique. Only dtypes restored across byte orders land here: a handful per program.
_EXPLICIT: dict[int, Any] = {}
# A view's dtype rebuilt to follow its root's explicit order -> the dtype the stream gave.
_ORIGIN: dict[int, tuple[Any, Any]] = {}


def _np() -> Any:
    return sys.modules["numpy"] if "numpy" in sys.modules else __import__("numpy")


def mark(d: Any) -> Any:
    _EXPLICIT[id(d)] = d
    return d


def _local(pickler: Any) -> dict[int, Any]:
    """Marks that only this capture makes (temporary dtypes of reinterpreting views)."""
    marks = getattr(pickler, "_sj_explicit", None)
    if marks is None:
        marks = {}
        pickler._sj_explicit = marks
    return marks


def is_explicit(d: Any, pickler: Any = None) -> bool:
    if _EXPLICIT.get(id(d)) is d:
        return True
    marks = getattr(pickler, "_sj_explicit", None) if pickler is not None else None
    return marks is not None and marks.get(id(d)) is d


def any_marks(pickler: Any = None) -> bool:
    return bool(_EXPLICIT) or bool(pickler is not None and getattr(pickler, "_sj_explicit", None))


# -- leaves and their states ------------------------------------------------------------------


def leaves(d: Any) -> list[Any]:
    """The dtype's leaves that have a byte order, in field order (padding has none)."""
    out: list[Any] = []

    def walk(x: Any) -> None:
        if x.names is not None:
            for name in x.names:
                walk(x.fields[name][0])
        elif x.subdtype is not None:
            walk(x.subdtype[0])
        elif x.byteorder != "|":
            out.append(x)

    walk(d)
    return out


def state(leaf: Any, pickler: Any = None) -> str:
    order = leaf.byteorder
    if order == "=":
        if is_explicit(leaf, pickler):
            return "L" if LITTLE else "B"
        return "N"
    return "L" if order == "<" else "B"


def native_paths(d: Any, pickler: Any = None) -> list[tuple[str, ...]]:
    """Field paths of the native leaves (the ones a big-endian machine must swap)."""
    out: list[tuple[str, ...]] = []

    def walk(x: Any, path: tuple[str, ...]) -> None:
        if x.names is not None:
            for name in x.names:
                walk(x.fields[name][0], (*path, name))
        elif x.subdtype is not None:
            walk(x.subdtype[0], path)
        elif x.byteorder == "=" and not is_explicit(x, pickler):
            out.append(path)

    walk(d, ())
    return out


def swap_in_place(arr: Any, paths: list[tuple[str, ...]]) -> None:
    for path in paths:
        sub = arr
        for name in path:
            sub = sub[name]
        sub.byteswap(inplace=True)


def has_explicit(d: Any, pickler: Any = None) -> bool:
    return any(state(x, pickler) != "N" for x in leaves(d))


# -- dtype descriptions in the manifest ----------------------------------------------------------


def _rechar(descr: Any, chars: Any) -> Any:
    if isinstance(descr, str):
        if descr[:1] in ("<", ">", "="):
            return next(chars) + descr[1:]
        return descr
    return [(entry[0], _rechar(entry[1], chars), *entry[2:]) for entry in descr]


def _chars(descr: Any) -> list[str]:
    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            if x[:1] in ("<", ">", "="):
                out.append(x[0])
        else:
            for entry in x:
                walk(entry[1])

    walk(descr)
    return out


def encode_descr(d: Any, pickler: Any = None, *, force: bool = False) -> tuple[Any, list[int]]:
    """(descr as a little-endian machine writes it, indices of explicit little leaves).

    ``force``: the native leaves are written as explicit, in this machine's order (a root
    whose bytes a view reinterprets)."""
    descr = _np().lib.format.dtype_to_descr(d)
    if LITTLE and not force and not any_marks(pickler):
        return descr, []
    states = [state(x, pickler) for x in leaves(d)]
    if force:
        states = [("L" if LITTLE else "B") if s == "N" else s for s in states]
    if len(states) != len(_chars(descr)):
        raise ValueError(f"cannot follow the byte order of dtype {d!r}")
    out = _rechar(descr, iter(["<" if s in ("N", "L") else ">" for s in states]))
    return out, [i for i, s in enumerate(states) if s == "L"]


def decode_descr(descr: Any, explicit: list[int] | None = None) -> Any:
    """The dtype this machine gives to a capsule's ``descr``: native leaves native here."""
    from sojourn.capsule.reducers.numpy import _from_descr

    if LITTLE and not explicit:
        return _from_descr(descr)
    wanted = set(explicit or ())
    chars = _chars(descr)
    states = ["B" if c == ">" else ("L" if i in wanted else "N") for i, c in enumerate(chars)]
    here = [NATIVE_CHAR if s == "N" else ("<" if s == "L" else ">") for s in states]
    d = _from_descr(_rechar(descr, iter(here)))
    fresh = {i for i, s in enumerate(states) if s == ("L" if LITTLE else "B")}
    return with_leaves(d, lambda i, leaf: mark(fresh_copy(leaf)) if i in fresh else leaf) if fresh else d


def fresh_copy(leaf: Any) -> Any:
    """A new dtype object equal to the native ``leaf`` (``np.dtype(x, copy=True)`` returns a
    copy that is not the process-wide one as it is)."""
    return leaf.newbyteorder("=")


def with_leaves(d: Any, replace: Any) -> Any:
    """``d`` rebuilt with ``replace(index, leaf)`` for each of its ordered leaves."""
    np = _np()
    count = [0]

    def build(x: Any) -> Any:
        if x.names is not None:
            fields = [x.fields[n] for n in x.names]
            spec: dict[str, Any] = {
                "names": list(x.names),
                "formats": [build(f[0]) for f in fields],
                "offsets": [f[1] for f in fields],
                "itemsize": x.itemsize,
            }
            if any(len(f) > 2 for f in fields):
                spec["titles"] = [f[2] if len(f) > 2 else None for f in fields]
            return np.dtype(spec, align=x.isalignedstruct)
        if x.subdtype is not None:
            base, shape = x.subdtype
            return np.dtype((build(base), shape))
        if x.byteorder == "|":
            return x
        i = count[0]
        count[0] += 1
        return replace(i, x)

    return build(d)


# -- views: do they see the byte order? ------------------------------------------------------


def _units(d: Any, pickler: Any) -> tuple[dict[int, tuple[int, str]], set[int]]:
    """Byte offsets within one element where a swap unit starts -> (size, state); covered bytes."""
    starts: dict[int, tuple[int, str]] = {}
    covered: set[int] = set()

    def walk(x: Any, at: int) -> None:
        if x.names is not None:
            for name in x.names:
                f = x.fields[name]
                walk(f[0], at + f[1])
        elif x.subdtype is not None:
            base, shape = x.subdtype
            for k in range(math.prod(shape)):
                walk(base, at + k * base.itemsize)
        elif x.byteorder != "|":
            unit = x.itemsize // 2 if x.kind == "c" else (4 if x.kind == "U" else x.itemsize)
            st = state(x, pickler)
            for k in range(x.itemsize // unit if unit else 0):
                starts[at + k * unit] = (unit, st)
            covered.update(range(at, at + x.itemsize))

    walk(d, 0)
    return starts, covered


def consistent(view: Any, root: Any, offset: int, pickler: Any = None) -> bool:
    """True when every byte order unit of ``view`` lies on one of ``root`` of the same size
    and state: swapping the root then swaps the view exactly (slices, transposes, field
    views, ``float64`` seen as ``int64``). False for views that reinterpret bytes."""
    P, V = root.dtype.itemsize, view.dtype.itemsize
    steps = [abs(s) for s, n in zip(view.strides, view.shape, strict=True) if n > 1]
    if view.dtype is root.dtype and offset % P == 0 and all(s % P == 0 for s in steps):
        return True
    if P == 0 or V == 0:
        return True
    g = math.gcd(P, *steps)
    # Many views share a layout (a structured array's field taken again and again).
    key = (id(root.dtype), id(view.dtype), offset % g, g)
    cache = getattr(pickler, "_sj_consistent", None) if pickler is not None else None
    if cache is not None and key in cache:
        return bool(cache[key][0])
    rs, rc = _units(root.dtype, pickler)
    vs, vc = _units(view.dtype, pickler)
    ok = (not rs and not vs) or all(
        all(rs.get((shift + b) % P) == unit for b, unit in vs.items())
        and not any(b not in vc and (shift + b) % P in rc for b in range(V))
        for shift in range(offset % g, P, g)
    )
    if pickler is not None:
        if cache is None:
            cache = pickler._sj_consistent = {}
        cache[key] = (ok, root.dtype, view.dtype)  # the dtypes keep their ids unique
    return ok


def rebase(dtype: Any, root: Any, offset: int) -> Any:
    """A view's dtype on restore: its native leaves take the order of the root's leaves
    they lie on (the root became explicit after the view was written)."""
    if not has_explicit(root.dtype) or all(state(x) != "N" for x in leaves(dtype)):
        return dtype
    rs, _ = _units(root.dtype, None)
    P = root.dtype.itemsize
    positions: list[int] = []

    def walk(x: Any, at: int) -> None:
        if x.names is not None:
            for name in x.names:
                f = x.fields[name]
                walk(f[0], at + f[1])
        elif x.subdtype is not None:
            walk(x.subdtype[0], at)
        elif x.byteorder != "|":
            positions.append(at)

    walk(dtype, 0)

    def follow(i: int, leaf: Any) -> Any:
        if state(leaf) != "N":
            return leaf
        unit = rs.get((offset + positions[i]) % P) if P else None
        st = unit[1] if unit else "N"
        if st == "N":
            return leaf
        if (st == "L") == LITTLE:
            return mark(fresh_copy(leaf))
        return leaf.newbyteorder("<" if st == "L" else ">")

    out = with_leaves(dtype, follow)
    if out is not dtype:
        _ORIGIN[id(out)] = (out, dtype)
    return out


def origin(d: Any) -> Any:
    """The dtype a view's stream gave, for a dtype :func:`rebase` made from it."""
    hit = _ORIGIN.get(id(d))
    return hit[1] if hit is not None and hit[0] is d else d


def explicit_copy(d: Any, pickler: Any) -> Any:
    """``d`` with its native leaves explicit in this machine's order, for this capture."""
    marks = _local(pickler)

    def fresh(_i: int, leaf: Any) -> Any:
        if state(leaf, pickler) != "N":
            return leaf
        copy = fresh_copy(leaf)
        marks[id(copy)] = copy
        return copy

    out = with_leaves(d, fresh)
    pickler.keepalive(out)
    return out


# -- dtype objects in the stream -------------------------------------------------------------


def shared_dtype(type_str: str) -> Any:
    """The process-wide dtype of a capsule's type string (native leaves are written ``<``)."""
    if not LITTLE and type_str[:1] == "<":
        type_str = NATIVE_CHAR + type_str[1:]
    return _np().dtype(type_str)


def explicit_dtype(inner: Any) -> Any:
    """Reconstructor: ``inner`` (native here) was explicitly little-endian."""
    if LITTLE:
        return mark(inner)
    return inner.newbyteorder("<")


def reduce_dtype(obj: Any, pickler: Any, shared_fn: Any) -> Any:
    """How a dtype object travels; ``shared_fn`` rebuilds a process-wide one by type string."""
    np = sys.modules["numpy"]
    pickler.note_module("numpy")
    order = obj.byteorder
    st = state(obj, pickler) if order != "|" else "|"
    if st == "L":
        inner = fresh_copy(obj)
        pickler.keepalive(inner)
        return (explicit_dtype, (inner,))
    try:
        shared = np.dtype(obj.str) is obj
    except TypeError:
        shared = False
    if shared:
        return (shared_fn, (obj.str if LITTLE or st != "N" else "<" + obj.str[1:],))
    # Structured, datetime, explicitly ordered...: numpy's own pickling, as a little-endian
    # machine and numpy 2.4 write it (numpy 2.2 gives a datetime scalar's dtype the metadata
    # {} where 2.4 says None: the same dtype).
    rv = obj.__reduce__()
    state_ = rv[2]
    if st == "N" and not LITTLE:
        state_ = (state_[0], "<", *state_[2:])
    if len(state_) == 9 and isinstance(state_[8], tuple) and state_[8] and state_[8][0] == {}:
        state_ = (*state_[:8], (None, *state_[8][1:]))
    return NotImplemented if state_ is rv[2] else (rv[0], rv[1], state_, *rv[3:])


# -- big-endian machines: numpy's own byte-holding pickles ---------------------------------------
#
# numpy scalars, and arrays of ndarray subclasses (matrix, recarray, masked arrays), pickle
# their raw native bytes next to a dtype and rebuild through numpy's functions. A big-endian
# machine writes them as a little-endian one does, and :mod:`sojourn.capsule.byteorder`'s
# unpickler swaps them back before numpy reads them.


def _swapped(raw: bytes, dtype: Any, paths: list[tuple[str, ...]]) -> bytes:
    arr = _np().frombuffer(bytearray(raw), dtype=dtype)
    swap_in_place(arr, paths)
    return arr.tobytes()


def _scalar_fn() -> Any:
    np = _np()
    core = getattr(np, "_core", None) or np.core
    return core.multiarray.scalar


def scalar_little(dtype: Any, data: Any = None) -> Any:
    """numpy's ``scalar(dtype, data)`` for a little-endian capsule, on a big-endian machine."""
    if isinstance(data, bytes):
        paths = native_paths(dtype)
        if paths:
            data = _swapped(data, dtype, paths)
    return _scalar_fn()(dtype, data) if data is not None else _scalar_fn()(dtype)


def reduce_scalar_big(obj: Any, pickler: Any) -> Any:
    pickler.note_module("numpy")
    rv = obj.__reduce_ex__(5)
    if isinstance(rv, tuple) and len(rv) >= 2 and len(rv[1]) == 2 and isinstance(rv[1][1], bytes):
        dtype, raw = rv[1]
        paths = native_paths(dtype, pickler)
        if paths:
            return (rv[0], (dtype, _swapped(raw, dtype, paths)), *rv[2:])
    return rv


def _array_state(state: Any) -> bool:
    np = _np()
    return (isinstance(state, tuple) and len(state) >= 5 and isinstance(state[2], np.dtype)
            and isinstance(state[4], bytes))


def reduce_subclass_big(arr: Any, pickler: Any) -> Any:
    """An ndarray subclass through its own pickling, its bytes written little-endian."""
    try:
        rv = arr.__reduce_ex__(5)
    except Exception as e:
        return pickler.problem(arr, f"its own pickling fails: {e}")
    if isinstance(rv, tuple) and len(rv) >= 3 and _array_state(rv[2]):
        state = rv[2]
        paths = native_paths(state[2], pickler)
        if paths and state[4]:
            state = (*state[:4], _swapped(state[4], state[2], paths), *state[5:])
            return (rv[0], rv[1], state, *rv[3:])
    return rv


from sojourn.capsule.registry import register  # noqa: E402  (after the helpers it registers)

if not LITTLE:
    from sojourn.capsule import byteorder

    register("numpy.generic", subclasses=True)(reduce_scalar_big)
    for _module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        byteorder.translate_global(_module, "scalar", scalar_little)

    @byteorder.build_hook
    def _build_big(inst: Any, st: Any) -> bool:
        np = sys.modules.get("numpy")
        if np is None or not isinstance(st, tuple):
            return False
        if isinstance(inst, np.dtype) and len(st) > 1 and st[1] in ("<", ">"):
            # "<" is native (or an explicit little order, which a wrapper applies after).
            inst.__setstate__((st[0], "=" if st[1] == "<" else ">", *st[2:]))
            if st[1] == ">":
                mark(inst)
            return True
        if isinstance(inst, np.ndarray) and _array_state(st):
            paths = native_paths(st[2])
            if paths and st[4]:
                st = (*st[:4], _swapped(st[4], st[2], paths), *st[5:])
            inst.__setstate__(st)
            return True
        return False


# -- long double: a format, not only a byte order ----------------------------------------------
#
# numpy's float128/complex256 is the C long double: x87's 80-bit extended precision padded to
# 16 bytes on x86_64, IEEE quadruple precision on arm64 and s390x, a plain double elsewhere.
# Its bytes mean other numbers on another machine even of the same byte order; sojourn does
# not convert between the formats and refuses rather than restore other values.


def longdouble_format() -> str:
    np = _np()
    info = np.finfo(np.longdouble)
    return f"{info.nmant}/{info.nexp}/{np.dtype(np.longdouble).itemsize}"


_FORMAT_NAMES = {"63/15/16": "x86's 80-bit extended precision", "63/15/12": "x86's 80-bit extended precision",
                 "112/15/16": "IEEE quadruple precision", "52/11/8": "double precision",
                 "105/11/16": "double-double"}


def has_longdouble(d: Any) -> bool:
    if d.names is None and d.subdtype is None:
        return d.char in ("g", "G")
    return any(x.char in ("g", "G") for x in leaves(d))


def check_longdouble(recorded: str | None, what: str) -> None:
    here = longdouble_format()
    if recorded is not None and recorded != here:
        def name(f: str) -> str:
            return _FORMAT_NAMES.get(f, f)
        from sojourn.errors import RestoreError

        raise RestoreError(
            f"{what} holds long double (float128) values in {name(recorded)}, and this machine's long "
            f"double is {name(here)}: the same bytes are other numbers here. Convert them to float64 "
            "before the pause (or restore on a machine like the one that wrote the capsule)."
        )


def longdouble_scalar(fmt: str, dtype: Any, data: bytes) -> Any:
    """Reconstructor of a float128/complex256 scalar, written little-endian with its format."""
    check_longdouble(fmt, "the capsule")
    if not LITTLE:
        data = _swapped(data, dtype, native_paths(dtype))
    return _scalar_fn()(dtype, data)


def reduce_longdouble(obj: Any, pickler: Any) -> Any:
    pickler.note_module("numpy")
    dtype, data = obj.__reduce_ex__(5)[1]
    if not LITTLE:
        data = _swapped(data, dtype, native_paths(dtype, pickler))
    return (longdouble_scalar, (longdouble_format(), dtype, data))


register("numpy.longdouble", "numpy.clongdouble")(reduce_longdouble)

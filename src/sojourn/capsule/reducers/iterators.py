"""Iterators mid-way: builtin iterators and itertools objects, portable across 3.11-3.14.

Every iterator travels as a *portable description* (a sojourn reconstructor and plain
arguments) and is rebuilt from public constructors, so that the items it still yields
are exactly the ones the original would have yielded, and what it iterates over is the
restored object itself (an iterator over a list in the namespace iterates over that
restored list). No itertools object's own pickle ever enters a capsule: itertools
pickling is deprecated in 3.12 and gone in 3.14. On the capture side the state is read
however the running Python allows: the deprecated ``__reduce__`` (3.11-3.13, its
warning silenced here), ``gc.get_referents`` (what an object holds, in C field order),
``__length_hint__`` and, for ``batched``, a field read at an offset calibrated at run
time on a probe object.

Decisions, by type (``consumed`` = items already produced; ``advance`` = consume that
many items of a fresh object, at C speed, so linear in ``consumed``):

=============================  ======================================  ========================================
type                           captured as                             rebuilt as
=============================  ======================================  ========================================
list/tuple/str/bytes/          native ``(iter|reversed, (seq,), i)``   native (portable 3.11-3.13)
bytearray/array/sequence
iterators, reversed,
list_reverseiterator
callable_iterator              native ``(iter, (fn, sentinel))``       native
range iterators                the range still to come                 ``iter(range)`` (3.11 and 3.12 differ)
dict key/value/item iterators  (dict, kind, consumed), checked         ``iter(dict.keys(d))`` & co. + advance
(and reversed)                 against the native list of the rest     (the SAME restored dict)
set/frozenset iterators,       the list of items still to come         ``iter(list)``: set order is not stable
OrderedDict iterators                                                  across processes, so no live link
deque iterators                (deque, index, reverse)                 ``iter(d)``/``reversed(d)`` + advance
enumerate, zip, map, filter    native (constructor + state)            native
count, repeat                  (value, step) / (value, times left)     ``count``/``repeat``; on 3.14 from
                                                                       repr/referents and ``__length_hint__``
cycle                          (it, saved) or (saved, index)           ``cycle(prefix(saved, it))`` + advance, or
                                                                       ``cycle(saved)`` + advance past pass 1
islice                         (it, start, stop, step) rebased         ``islice`` with the rebased bounds
chain                          (source, active) from the referents     ``chain.from_iterable(prefix((active,),
                               (so on 3.14 too)                        source))``
accumulate                     (it, func, fresh|initial|total, v)      ``accumulate(it, f, initial=v)`` and one
                                                                       item skipped (total ``None``: via prefix)
starmap, filterfalse,          constructor arguments                   the constructor
compress
takewhile                      (pred, it), or "exhausted" once false   constructor / a stopped takewhile
dropwhile                      (pred, it), or (it,) once it stopped    ``dropwhile(<always false>, it)``
                               dropping
zip_longest                    inputs (None = exhausted), fillvalue    ``zip_longest`` with ``()`` for None
product, permutations,         pools, r, consumed (rank of the last    a fresh object + advance
combinations(_w_replacement)   indices, computed, see ``_rank``)
groupby                        (it, key, ()|(tgt,)|(tgt, cur, val));   ``groupby(prefix((val,), it), key')`` with
                               tgt alone is read from the referents    a first key given, then ``next`` to open
                               (native pickling loses it)              the current group
_grouper                       "the current group of <groupby>", or    the grouper opened by the groupby's
                               exhausted when no longer current        rebuild, or a stale grouper
tee                            (family, position): all live tees of    ``tee(prefix(buffer, it))``, one
                               one buffer share one family (found      ``copy`` per member, + advance
                               with gc), buffer = values still needed
pairwise                       (it, old?) from the referents           ``pairwise(prefix((old,), it))``
batched (3.12+)                (it, n, strict), n read at a            ``batched``; on 3.11 (and strict on 3.12)
                               calibrated offset                       a small emulation with the same output
=============================  ======================================  ========================================

``prefix(items, it)`` is :class:`_Prefix`, a subclass of ``chain`` (C speed) that puts back
items a rebuild had to take out of ``it``. Its parents describe it as plain ``it`` once the
items are used up, and nested ones are flattened, so that wrappers never pile up over
many pause/resume cycles. Everything a rebuild calls is public on 3.14 too (constructors,
``copy.copy`` of a tee).

Exhausted iterators travel as ``_exhausted(kind)``: an empty object of the same type, run
to its end. The native pickles of exhausted builtin iterators change type and differ
between versions, so they are not kept.

Refused, with a reason (``pickler.problem``, never a wrong result): on Python 3.14+ every
itertools object whose state only the removed ``__reduce__`` exposed (all but count,
repeat, chain, pairwise, batched); a dict iterator whose dict changed in a way that makes
its position ambiguous; internal tee data; instances of user subclasses of itertools
types (where the registry matches subclasses), which public constructors cannot rebuild.

Fingerprints: a rebuilt object whose own state differs in shape from the captured one
(it reads through a prefix, say) records its description in the restore context
(``RestoreContext.canonical``, by id, kept alive), and the reducers answer with that
description while the restore checks fingerprints. Nothing runs between rebuilding and
checking, so the description cannot be stale; after the restore, objects reduce from
their live state again.

The shared helpers, :class:`_Prefix` and the builtin iterators are here; the itertools types
whose state their pickling (or repr, or referents) gives are in
:mod:`sojourn.capsule.reducers.iterators_itertools`, and those whose state it loses or never
exposed in :mod:`sojourn.capsule.reducers.iterators_hidden`. Importing this module registers
all three.
"""

from __future__ import annotations

import array
import collections
import gc
import inspect
import itertools
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from sojourn.capsule.context import current_or_none
from sojourn.capsule.registry import register

_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


class _Unreadable(Exception):
    """The state of an iterator cannot be read or described; the message says why."""


# -- shared helpers -----------------------------------------------------------------------


def _reducer(*names: str) -> Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]]:
    """Register a reducer that answers a remembered description first and turns failures
    into problems (every one is reported at once by the capture)."""
    # A user subclass of an itertools type would otherwise fall back to itertools pickling.
    opts: dict[str, Any] = {}
    if names[0].startswith("itertools.") and "subclasses" in inspect.signature(register).parameters:
        opts["subclasses"] = True

    def deco(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def reduce(obj: Any, pickler: Any) -> Any:
            ctx = current_or_none()
            if ctx is not None and id(obj) in ctx.canonical:
                return ctx.canonical[id(obj)]
            if opts and type(obj).__module__ != "itertools":
                return pickler.problem(obj, _SUBCLASS_REASON)
            try:
                return fn(obj, pickler)
            except Exception as e:
                reason = str(e) if isinstance(e, _Unreadable) else f"its state could not be read ({type(e).__name__}: {e})"
                return pickler.problem(obj, reason)

        register(*names, **opts)(reduce)
        return fn

    return deco


_SUBCLASS_REASON = (
    "it is an instance of a subclass of an itertools type: sojourn rebuilds itertools objects "
    "from their public constructors, which would lose the subclass; use the itertools type "
    "itself, or an iterator class of your own"
)


def _remember(obj: Any, description: tuple[Any, ...]) -> Any:
    """Keep the description of a rebuilt object for the fingerprint check of this restore."""
    ctx = current_or_none()
    if ctx is not None:
        ctx.canonical[id(obj)] = description
        ctx.keepalive.append(obj)
    return obj


def _state(obj: Any) -> tuple[Any, ...]:
    """The (deprecated) native reduce of an itertools object, or why there is none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            rv = obj.__reduce__()
        except TypeError:
            rv = None
    if not isinstance(rv, tuple) or len(rv) < 2 or rv[0] not in (type(obj), itertools.islice, iter):
        raise _Unreadable(
            f"Python {_PY} does not expose the state of {type(obj).__module__}."
            f"{type(obj).__qualname__} (its pickling was removed in Python 3.14); capture on "
            "Python 3.11-3.13, or turn it into a list before capturing"
        )
    return rv


def _refs(obj: Any) -> list[Any]:
    """What ``obj`` holds, in C field order, without the type that heap types also visit."""
    refs = gc.get_referents(obj)
    if type(obj).__flags__ & (1 << 9) and refs and refs[0] is type(obj):  # Py_TPFLAGS_HEAPTYPE
        refs = refs[1:]
    return refs


def _advance(it: Iterator[Any], n: int) -> None:
    if n:
        next(itertools.islice(it, n, n), None)


def _false(_: Any) -> bool:
    return False


def _none() -> None:
    return None


class _NoItems:
    """A sequence without items: ``iter()`` of it is the generic sequence iterator."""

    def __getitem__(self, i: int) -> Any:
        raise IndexError(i)


_EMPTY: dict[str, Callable[[], Iterator[Any]]] = {
    "list_iterator": lambda: iter([]),
    "tuple_iterator": lambda: iter(()),
    "str_ascii_iterator": lambda: iter(""),
    "str_iterator": lambda: iter("\u0101"),
    "bytes_iterator": lambda: iter(b""),
    "bytearray_iterator": lambda: iter(bytearray()),
    "arrayiterator": lambda: iter(array.array("b")),
    "iterator": lambda: iter(_NoItems()),  # type: ignore[call-overload]
    "callable_iterator": lambda: iter(_none, None),
    "list_reverseiterator": lambda: reversed([]),
    "reversed": lambda: reversed(()),
    "set_iterator": lambda: iter(set()),
    "odict_iterator": lambda: iter(collections.OrderedDict()),
    "dict_keyiterator": lambda: iter({}),
    "dict_valueiterator": lambda: iter({}.values()),
    "dict_itemiterator": lambda: iter({}.items()),
    "dict_reversekeyiterator": lambda: reversed({}),
    "dict_reversevalueiterator": lambda: reversed({}.values()),
    "dict_reverseitemiterator": lambda: reversed({}.items()),
    "islice": lambda: itertools.islice((), 0),
    "chain": lambda: itertools.chain(),
    "takewhile": lambda: itertools.takewhile(_false, (None,)),
    "product": lambda: itertools.product(()),
    "permutations": lambda: itertools.permutations((), 1),
    "combinations": lambda: itertools.combinations((), 1),
    "combinations_with_replacement": lambda: itertools.combinations_with_replacement((), 1),
    "pairwise": lambda: itertools.pairwise(()),
    "batched": lambda: iterators_hidden.make_batched(iter(()), 1, False),
    "_grouper": lambda: iterators_hidden.stale_grouper(),
}


def _exhausted(kind: str) -> Any:
    """An iterator of type ``kind`` that has already run to its end."""
    try:
        it = _EMPTY[kind]()
    except KeyError:
        raise ValueError(f"this sojourn cannot rebuild an exhausted {kind!r}; update sojourn") from None
    for _ in it:
        pass
    return _remember(it, (_exhausted, (kind,)))


class _Prefix(itertools.chain[Any]):
    """``chain(items, it)``, made by a rebuild to put back items already read from ``it``.

    Parents describe it through :func:`_unwrap`, which gives just ``it`` once the items are
    used up: wrappers must not pile up over many pause/resume cycles. A subclass, so that
    it iterates at C speed and is told apart from the user's own chains.
    """

    __slots__ = ()


def _make_prefix(items: list[Any], rest: Any) -> _Prefix:
    return _Prefix(items, iter(rest))


def _prefix_parts(p: _Prefix) -> tuple[list[Any], Any]:
    """(items still to come before ``it``, ``it``), read from the chain's fields."""
    refs = _refs(p)  # [source, active]; none once everything, ``it`` too, is used up
    if not refs:
        return [], iter(())
    source, active = refs[0], (refs[1] if len(refs) > 1 else None)
    rv = source.__reduce__()  # the tuple iterator over (items, it)
    parts, k = rv[1][0], (rv[2] if len(rv) > 2 else None)
    if not (isinstance(parts, tuple) and len(parts) == 2 and k in (0, 1, 2)):
        raise _Unreadable("an internal sojourn wrapper is in an unexpected state")
    if k == 0:
        return list(parts[0]), parts[1]
    if k == 1:
        if active is None:
            return [], parts[1]
        rest = active.__reduce__()  # list or tuple iterator over the items
        return (list(rest[1][0][rest[2]:]) if len(rest) > 2 else []), parts[1]
    return [], active if active is not None else parts[1]


def _unwrap(x: Any) -> Any:
    """``x``, or what a rebuild's wrapper stands for once its items are used up."""
    while type(x) is _Prefix:
        items, rest = _prefix_parts(x)
        if items:
            return x
        x = rest
    return x


@_reducer("sojourn.capsule.reducers.iterators._Prefix")
def _prefix_reduce(obj: _Prefix, pickler: Any) -> Any:
    items, rest = _prefix_parts(obj)
    while type(rest) is _Prefix:  # nested wrappers are internal: flatten them
        more, rest = _prefix_parts(rest)
        items += more
    return (_make_prefix, (items, rest))


# -- builtin iterators ----------------------------------------------------------------------


@_reducer(
    *(
        "builtins." + k
        for k in ("list_iterator", "tuple_iterator", "str_iterator", "str_ascii_iterator",
                  "bytes_iterator", "bytearray_iterator", "iterator", "list_reverseiterator",
                  "reversed")
    ),
    "array.arrayiterator",
)
def _seq_iter_reduce(obj: Any, pickler: Any) -> Any:
    rv = obj.__reduce__()
    # Running: (iter or reversed, (seq,), index): portable and a fixpoint. Exhausted: the
    # native form drops the sequence and its index (and 3.13 drops it one item earlier
    # for reversed lists), so it would come back as another type.
    if len(rv) > 2 and rv[2] is not None and rv[2] != -1:
        return rv
    return (_exhausted, (type(obj).__name__,))


@_reducer("builtins.callable_iterator")
def _callable_iter_reduce(obj: Any, pickler: Any) -> Any:
    rv = obj.__reduce__()
    return rv if len(rv[1]) == 2 else (_exhausted, ("callable_iterator",))


@_reducer("builtins.range_iterator", "builtins.longrange_iterator")
def _range_iter_reduce(obj: Any, pickler: Any) -> Any:
    # 3.11 gives (iter, (whole range,), index), 3.12+ (iter, (rest,), None): describe the
    # rest, with a normalised stop, so both versions write the same bytes.
    rv = obj.__reduce__()
    rest = rv[1][0]
    if len(rv) > 2 and rv[2] is not None:
        rest = rest[rv[2]:]
    n = len(rest)
    rest = range(rest.start, rest.start + n * rest.step, rest.step) if n else range(0)
    return (iter, (rest,))


_DICT_ITERS: dict[str, Callable[[dict[Any, Any]], Iterator[Any]]] = {
    # dict's own methods, so that a subclass overriding keys() or __iter__ changes nothing
    "dict_keyiterator": lambda d: iter(dict.keys(d)),
    "dict_valueiterator": lambda d: iter(dict.values(d)),
    "dict_itemiterator": lambda d: iter(dict.items(d)),
    "dict_reversekeyiterator": lambda d: reversed(dict.keys(d)),
    "dict_reversevalueiterator": lambda d: reversed(dict.values(d)),
    "dict_reverseitemiterator": lambda d: reversed(dict.items(d)),
}


def _same_items(a: list[Any], b: list[Any]) -> bool:
    def same(x: Any, y: Any) -> bool:
        if x is y:
            return True
        return type(x) is tuple and type(y) is tuple and len(x) == len(y) and all(p is q for p, q in zip(x, y, strict=True))

    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


@_reducer(*("builtins." + k for k in _DICT_ITERS))
def _dict_iter_reduce(obj: Any, pickler: Any) -> Any:
    kind = type(obj).__name__
    try:
        remaining = obj.__reduce__()[1][0]
    except RuntimeError as e:  # the dict changed size, or its keys, meanwhile
        raise _Unreadable(f"its dict was changed while it was part-way through it ({e}); "
                          "finish or recreate the iterator before capturing") from None
    owners = [r for r in gc.get_referents(obj) if isinstance(r, dict)]
    if not owners:
        return (_exhausted, (kind,))
    d = owners[0]
    consumed = len(d) - obj.__length_hint__()
    probe = _DICT_ITERS[kind](d)
    _advance(probe, consumed)
    if not _same_items(list(probe), remaining):
        raise _Unreadable(
            "its dict was changed while it was part-way through it, so its position is "
            "ambiguous; finish or recreate the iterator before capturing"
        )
    return (_dict_iter, (d, kind, consumed))


def _dict_iter(d: dict[Any, Any], kind: str, consumed: int) -> Iterator[Any]:
    it = _DICT_ITERS[kind](d)
    _advance(it, consumed)
    return it


@_reducer("builtins.set_iterator", "builtins.odict_iterator")
def _rest_only_reduce(obj: Any, pickler: Any) -> Any:
    remaining = obj.__reduce__()[1][0]
    if not remaining:
        return (_exhausted, (type(obj).__name__,))
    return (_items_left, (remaining,))


def _items_left(items: list[Any]) -> Iterator[Any]:
    return _remember(iter(items), (_items_left, (items,)))  # type: ignore[no-any-return]


@_reducer(
    "_collections._deque_iterator", "collections._deque_iterator",
    "_collections._deque_reverse_iterator", "collections._deque_reverse_iterator",
)
def _deque_iter_reduce(obj: Any, pickler: Any) -> Any:
    # The native pickle names collections._deque_iterator on 3.12+, which 3.11 lacks.
    d, index = obj.__reduce__()[1]
    return (_deque_iter, (d, index, "reverse" in type(obj).__name__))


def _deque_iter(d: collections.deque[Any], index: int, reverse: bool) -> Iterator[Any]:
    it = reversed(d) if reverse else iter(d)
    _advance(it, index)
    return it


# The itertools reducers import the helpers above; importing them registers them. The tests
# read _count_fallback, _rank and _repeat_fallback through this module, where they were first.
from sojourn.capsule.reducers import iterators_hidden  # noqa: E402
from sojourn.capsule.reducers.iterators_itertools import _count_fallback as _count_fallback  # noqa: E402
from sojourn.capsule.reducers.iterators_itertools import (  # noqa: E402
    _make_accumulate,
    _make_chain,
    _make_combinatoric,
    _make_count,
    _make_cycle,
    _make_cycled,
    _make_dropped,
    _make_islice,
    _make_repeat,
    _make_simple,
    _make_zip_longest,
)
from sojourn.capsule.reducers.iterators_itertools import _rank as _rank  # noqa: E402
from sojourn.capsule.reducers.iterators_itertools import _repeat_fallback as _repeat_fallback  # noqa: E402

# A capsule names each reconstructor by module and qualname, and a restore pickles what it
# rebuilt again and compares the bytes with the capture's: the reconstructors that moved to
# iterators_itertools keep the name they had here, so capsules written before the move
# restore (and pass that check) as before.
for _fn in (
    _make_count,
    _make_repeat,
    _make_simple,
    _make_dropped,
    _make_islice,
    _make_chain,
    _make_accumulate,
    _make_cycle,
    _make_cycled,
    _make_zip_longest,
    _make_combinatoric,
):
    _fn.__module__ = __name__
del _fn

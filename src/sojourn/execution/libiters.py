"""Library iterators in the program's loops: rebuilt from their call and advanced.

``for p in model.parameters()``, ``for name, m in model.named_modules()``, ``for k, g in
df.groupby("k")`` and ``for i, row in df.iterrows()`` loop over a library *generator*,
whose running frame cannot travel. But each of these is a pure function of its arguments
and of the objects they name: the same call made again, on the restored objects, yields
the same items. So the ``for`` hook (:mod:`sojourn.execution.iterhooks`) wraps such an
iterator, when the loop starts, in a :class:`LibIter` that remembers the call (function,
arguments, read from the generator's frame before it ran) and counts the items it passed
on. A LibIter travels as ``(call, count)``; after a restore the call is made again and
``count`` items are skipped (linear in ``count``: the items are computed again, not
loaded), before the program carries on.

What counts as "pure" is a list (:data:`KNOWN`), not a guess: a library generator that
reads a file, a clock or a random source would come back different, and stays refused.
The rebuilt generator sees the objects as they are at the pause: a loop that changed what
it iterates over (added a submodule) before the pause would see those changes. pandas'
``iterrows``, ``DataFrame.items`` and groupby iteration iterate the frame's values as they
were when the loop started; they are made again over a shallow copy taken then (free under
copy-on-write until either is written), so rows the loop edited ahead of the pause come back
as they were.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

from sojourn.capsule.registry import register
from sojourn.execution.iterhooks import register_iter_hook, watch

# (module, qualified name) of library generator functions that yield the same items when
# called again with the same arguments on the same objects.
KNOWN: set[tuple[str, str]] = {
    *(("torch.nn.modules.module", f"Module.{name}") for name in (
        "parameters", "named_parameters", "buffers", "named_buffers", "children",
        "named_children", "modules", "named_modules")),
    ("pandas.core.frame", "DataFrame.iterrows"),
    ("pandas.core.frame", "DataFrame.items"),
}
GROUPBY = "pandas.core.groupby.groupby.BaseGroupBy"
# Generators over a frame's values as they were when iteration started.
SNAPSHOT = {("pandas.core.frame", "DataFrame.iterrows"), ("pandas.core.frame", "DataFrame.items")}


def _function_key(g: types.GeneratorType) -> tuple[Any, str]:
    frame = g.gi_frame
    return (frame.f_globals.get("__name__") if frame is not None else None, g.gi_code.co_qualname)

_PENDING: weakref.WeakSet[LibIter] = weakref.WeakSet()
# A library generator a LibIter wraps -> that LibIter: the program may hold the generator
# itself too (``params = model.parameters()``, then ``for p in params``).
_WRAPPED: weakref.WeakKeyDictionary[Any, LibIter] = weakref.WeakKeyDictionary()


class LibIter:
    """A library iterator and the call that made it, counting the items it passed on."""

    __slots__ = ("__weakref__", "_call", "_count", "_it")

    def __init__(self, it: Iterator[Any] | None, call: tuple[Any, tuple[Any, ...], dict[str, Any]], count: int = 0):
        self._it = it
        self._call = call
        self._count = count

    def __iter__(self) -> LibIter:
        return self

    def __next__(self) -> Any:
        it = self._it
        if it is None:
            it = self.rebuild()
        item = next(it)
        self._count += 1
        return item

    def rebuild(self) -> Iterator[Any]:
        """Make the call again and skip the items already passed on."""
        fn, args, kwargs = self._call
        it = iter(fn(*args, **kwargs))
        if self._count:
            # Consumed at C speed; an iterator that ends early ends the loop, as it would have.
            next(itertools.islice(it, self._count, self._count), None)
        self._it = it
        _PENDING.discard(self)
        _wrap(it, self)
        return it

    def __length_hint__(self) -> int:
        return 0 if self._it is None else int(getattr(self._it, "__length_hint__", lambda: 0)())


def _wrap(it: Any, wrapper: LibIter) -> None:
    if isinstance(it, types.GeneratorType):
        _WRAPPED[it] = wrapper


def _inner(wrapper: LibIter) -> Any:
    return wrapper._it if wrapper._it is not None else wrapper.rebuild()


def _rebuilt(call: tuple[Any, tuple[Any, ...], dict[str, Any]], count: int) -> LibIter:
    it = LibIter(None, call, count)
    _PENDING.add(it)
    return it


@register("sojourn.execution.libiters.LibIter")
def _libiter_reduce(it: LibIter, pickler: Any) -> Any:
    return (_rebuilt, (it._call, it._count))


def materialize() -> None:
    """Rebuild the library iterators of a restored capsule (after everything is restored,
    before the program carries on), so that they see the objects as the pause left them."""
    for it in list(_PENDING):
        if it._it is None:
            it.rebuild()


# -- library generators held anywhere (not only by a loop): rebuilt from their frame ---------------
#
# A few generators' whole state is in their frame's locals: ``RangeIndex.__iter__`` is
# ``yield from self._range`` (the range iterator travels), ``ExtensionArray.__iter__`` is
# ``for i in range(len(self)): yield self[i]`` (the next index is ``i + 1``). pandas'
# ``itertuples()`` zips such iterators over the index and the columns. They travel as a
# generator of sojourn's that does the same from where they stood; a known pure generator
# that has not started travels as its call.


def _yield_from(it: Any) -> Iterator[Any]:
    yield from it


def _items_from(arr: Any, start: int) -> Iterator[Any]:
    for i in range(start, len(arr)):
        yield arr[i]


def _called(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


def _frame_of(g: types.GeneratorType) -> dict[str, Any]:
    return g.gi_frame.f_locals if g.gi_frame is not None else {}


def _rebuild_yield_from(g: types.GeneratorType, attr: str | None) -> tuple[Any, ...] | None:
    inner = g.gi_yieldfrom
    if inner is None:
        if inspect.getgeneratorstate(g) != inspect.GEN_CREATED:
            return None
        loc = _frame_of(g)
        inner = getattr(loc["self"], attr) if attr else loc["it"]
        inner = iter(inner)
    return (_yield_from, (inner,))


def _rebuild_items(g: types.GeneratorType, own: bool) -> tuple[Any, ...] | None:
    loc = _frame_of(g)
    arr = loc.get("arr" if own else "self")
    if inspect.getgeneratorstate(g) == inspect.GEN_CREATED:
        start = loc["start"] if own else 0
    elif "i" in loc:
        start = loc["i"] + 1
    else:
        return None
    return (_items_from, (arr, start))


_REBUILD: dict[tuple[str, str], Any] = {
    ("pandas.core.indexes.range", "RangeIndex.__iter__"): lambda g: _rebuild_yield_from(g, "_range"),
    ("pandas.core.arrays.base", "ExtensionArray.__iter__"): lambda g: _rebuild_items(g, False),
    (__name__, "_yield_from"): lambda g: _rebuild_yield_from(g, None),
    (__name__, "_items_from"): lambda g: _rebuild_items(g, True),
}


def reduce_generator(g: types.GeneratorType) -> tuple[Any, ...] | None:
    """How a library generator travels, when sojourn knows; None: it cannot."""
    wrapper = _WRAPPED.get(g)
    if wrapper is not None:
        return (_inner, (wrapper,))  # what a loop's LibIter iterates: that LibIter's, rebuilt
    frame = g.gi_frame
    if frame is None:
        return None
    module = frame.f_globals.get("__name__")
    if not isinstance(module, str):
        return None
    key = (module, g.gi_code.co_qualname)
    rebuild = _REBUILD.get(key)
    if rebuild is not None:
        return rebuild(g)  # type: ignore[no-any-return]
    if key in KNOWN and inspect.getgeneratorstate(g) == inspect.GEN_CREATED:
        fn = _function(g)
        if fn is not None:
            return (_called, _call_of(g, fn))
    return None


# -- the hooks ----------------------------------------------------------------------------------


def _function(g: types.GeneratorType) -> Any:
    """The library function whose call made generator ``g``, when it is a known pure one."""
    frame = g.gi_frame
    if frame is None:
        return None
    module = frame.f_globals.get("__name__")
    qualname = g.gi_code.co_qualname
    if not isinstance(module, str) or (module, qualname) not in KNOWN:
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj if getattr(obj, "__code__", None) is g.gi_code else None


def _call_of(g: types.GeneratorType, fn: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The arguments of the call that made ``g``, from its frame before it ran."""
    code = g.gi_code
    loc = g.gi_frame.f_locals  # type: ignore[union-attr]
    names = code.co_varnames
    n, k = code.co_argcount, code.co_kwonlyargcount
    args = [loc[x] for x in names[:n]]
    kwargs = {x: loc[x] for x in names[n:n + k]}
    i = n + k
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(loc[names[i]])
        i += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(loc[names[i]])
    return (fn, tuple(args), kwargs)


def _generator_hook(g: Any) -> Iterator[Any]:
    if inspect.getgeneratorstate(g) == inspect.GEN_CREATED:
        fn = _function(g)
        if fn is not None:
            call = _call_of(g, fn)
            if _function_key(g) in SNAPSHOT:
                # The frame as the loop starts: pandas iterates a snapshot of it (its values),
                # so a rebuild must too, not the frame the loop may have written to since.
                # A shallow copy costs nothing until one of the two is written (copy-on-write).
                call = (call[0], (call[1][0].copy(deep=False), *call[1][1:]), call[2])
            it = LibIter(g, call)
            _wrap(g, it)
            return it
    return g  # type: ignore[no-any-return]


def _groupby_hook(gb: Any) -> Iterator[Any]:
    # pandas iterates a sorted copy of the frame made at the first item: a rebuild iterates
    # the frame as the loop started too (a shallow copy, free until written), not as the
    # loop may have edited it since. The groups' keys were computed when gb was made.
    snap = gb
    obj = getattr(gb, "obj", None)
    if obj is not None and hasattr(obj, "copy") and "obj" in vars(gb):
        snap = copy.copy(gb)
        vars(snap).pop("_cache", None)  # cached selections of the original frame
        snap.obj = obj.copy(deep=False)
    return LibIter(iter(gb), (iter, (snap,), {}))


_installed = False


def install() -> None:
    """Register the hooks (nothing is imported: they apply once torch or pandas is)."""
    global _installed
    if not _installed:
        # One hook for generators, armed by either library's import.
        register_iter_hook("builtins.generator", _generator_hook, module="torch")
        register_iter_hook("builtins.generator", _generator_hook, module="pandas")
        register_iter_hook(GROUPBY, _groupby_hook, module="pandas")
        _installed = True
    watch()

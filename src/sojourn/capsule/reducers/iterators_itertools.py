"""itertools objects whose state their own pickling gives (3.11-3.13), or, on 3.14, their repr
or what they hold: counters, simple wrappers, slicing, chaining, accumulating, cycling and
the combinatorics (by rank). The decisions are in the table of
:mod:`sojourn.capsule.reducers.iterators`; the helpers are shared with it.
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Callable
from typing import Any

from sojourn.capsule.reducers.iterators import (
    _PY,
    _advance,
    _exhausted,
    _false,
    _Prefix,
    _reducer,
    _refs,
    _remember,
    _state,
    _Unreadable,
    _unwrap,
)

# -- itertools: counters and simple wrappers -------------------------------------------------


@_reducer("itertools.count")
def _count_reduce(obj: Any, pickler: Any) -> Any:
    try:
        args = _state(obj)[1]
    except _Unreadable:
        args = _count_fallback(obj)
    return (_make_count, (args[0], args[1] if len(args) > 1 else 1))


def _count_fallback(obj: Any) -> tuple[Any, ...]:
    """count's state without ``__reduce__`` (3.14+): its repr, else what it holds."""
    text = repr(obj)
    try:
        args = ast.literal_eval("(" + text[text.index("(") + 1 : -1] + ",)")
        if all(isinstance(a, int | float | complex) for a in args):
            return tuple(args)
    except (ValueError, SyntaxError):
        pass
    refs = _refs(obj)  # the slow mode holds its count and step as objects
    if len(refs) == 2:
        return (refs[0], refs[1])
    raise _Unreadable(f"the state of this itertools.count cannot be read on Python {_PY}")


def _make_count(start: Any, step: Any) -> Any:
    return itertools.count(start, step)


@_reducer("itertools.repeat")
def _repeat_reduce(obj: Any, pickler: Any) -> Any:
    try:
        args = _state(obj)[1]
    except _Unreadable:
        args = _repeat_fallback(obj)
    return (_make_repeat, (args[0], args[1] if len(args) > 1 else None))


def _repeat_fallback(obj: Any) -> tuple[Any, ...]:
    refs = _refs(obj)
    if len(refs) != 1:
        raise _Unreadable(f"the state of this itertools.repeat cannot be read on Python {_PY}")
    try:
        return (refs[0], obj.__length_hint__())
    except TypeError:  # repeat forever has no length
        return (refs[0],)


def _make_repeat(value: Any, times: int | None) -> Any:
    return itertools.repeat(value) if times is None else itertools.repeat(value, times)


def _simple(kind: str, build: Callable[..., Any]) -> None:
    """Types whose whole state is their constructor arguments."""

    def reduce(obj: Any, pickler: Any) -> Any:
        return (_make_simple, (kind, _state(obj)[1]))

    _SIMPLE[kind] = build
    _reducer("itertools." + kind)(reduce)


_SIMPLE: dict[str, Callable[..., Any]] = {}


def _make_simple(kind: str, args: tuple[Any, ...]) -> Any:
    return _SIMPLE[kind](*args)


_simple("starmap", itertools.starmap)
_simple("filterfalse", itertools.filterfalse)
_simple("compress", itertools.compress)


@_reducer("itertools.takewhile")
def _takewhile_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    if len(rv) > 2 and rv[2]:  # once false, it never yields again
        return (_exhausted, ("takewhile",))
    return (_make_simple, ("takewhile", rv[1]))


_SIMPLE["takewhile"] = itertools.takewhile


@_reducer("itertools.dropwhile")
def _dropwhile_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    pred, it = rv[1]
    if (len(rv) > 2 and rv[2]) or pred is _false:  # the predicate is never called again
        return (_make_dropped, (it,))
    return (_make_simple, ("dropwhile", rv[1]))


_SIMPLE["dropwhile"] = itertools.dropwhile


def _make_dropped(it: Any) -> Any:
    return itertools.dropwhile(_false, it)


@_reducer("itertools.islice")
def _islice_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    if len(rv[1]) < 4:
        return (_exhausted, ("islice",))
    it, nxt, stop, step = rv[1]
    cnt = rv[2] if len(rv) > 2 else 0
    # Rebased on what the iterator has consumed, an islice rebuilt with these bounds has
    # the same state (count 0), so this is a fixpoint and needs no islice pickling.
    return (_make_islice, (it, nxt - cnt, None if stop is None else stop - cnt, step))


def _make_islice(it: Any, start: int, stop: int | None, step: int) -> Any:
    return itertools.islice(it, start, stop, step)


@_reducer("itertools.chain")
def _chain_reduce(obj: Any, pickler: Any) -> Any:
    refs = _refs(obj)  # [source, active]: no __reduce__ needed, so this works on 3.14 too
    if not refs:
        return (_exhausted, ("chain",))
    if len(refs) > 2:
        raise _Unreadable(f"itertools.chain has an unknown layout on Python {_PY}")
    return (_make_chain, (_unwrap(refs[0]), refs[1] if len(refs) > 1 else None))


def _make_chain(source: Any, active: Any) -> Any:
    if active is None:
        return itertools.chain.from_iterable(source)
    c = itertools.chain.from_iterable(_Prefix((active,), source))
    return _remember(c, (_make_chain, (source, active)))


def _chain_parts(ch: Any) -> tuple[Any, Any]:
    """``(x, it)`` from ``chain((x,), it)`` built by accumulate's own reduce."""
    rv = _state(ch)
    source = rv[2][0] if len(rv) > 2 and len(rv[2]) == 1 else None
    parts = source.__reduce__()[1][0] if type(source) is type(iter(())) else None
    if not (isinstance(parts, tuple) and len(parts) == 2 and isinstance(parts[0], tuple) and len(parts[0]) == 1):
        raise _Unreadable("this itertools.accumulate is in a state sojourn does not know")
    return parts[0][0], parts[1]


@_reducer("itertools.accumulate")
def _accumulate_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    if rv[0] is itertools.islice:  # the running total is None: islice(accumulate(chain((None,), it)), 1)
        _, (ch, func) = _state(rv[1][0])[:2]
        _, it = _chain_parts(ch)
        return (_make_accumulate, (_unwrap(it), func, "total", None))
    (it, func), total = rv[1], (rv[2] if len(rv) > 2 else None)
    if not any(r is it for r in _refs(obj)):  # a pending initial value, wrapped by the reduce
        initial, it = _chain_parts(it)
        return (_make_accumulate, (_unwrap(it), func, "initial", initial))
    return (_make_accumulate, (_unwrap(it), func, "fresh" if total is None else "total", total))


def _make_accumulate(it: Any, func: Any, mode: str, value: Any) -> Any:
    if mode == "fresh":
        return itertools.accumulate(it, func)
    if mode == "initial":
        return itertools.accumulate(it, func, initial=value)
    if value is None:  # initial=None means "no initial": feed the None through a chain
        acc = itertools.accumulate(_Prefix((None,), it), func)
        next(acc)
        return _remember(acc, (_make_accumulate, (it, func, mode, value)))
    acc = itertools.accumulate(it, func, initial=value)
    next(acc)  # yields the total itself without touching ``it``
    return acc


@_reducer("itertools.cycle")
def _cycle_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    it, (saved, firstpass) = rv[1][0], rv[2]
    if not firstpass:
        return (_make_cycle, (_unwrap(it), saved))
    # Past the first pass the reduce gives iter(saved) set to the next index.
    f, args, *index = it.__reduce__()
    if f is not iter or args[0] is not saved:
        raise _Unreadable("this itertools.cycle is in a state sojourn does not know")
    return (_make_cycled, (saved, index[0] if index and index[0] is not None else 0))


def _make_cycle(it: Any, saved: list[Any]) -> Any:
    c = itertools.cycle(_Prefix(saved, it))
    _advance(c, len(saved))  # the saved items go in again; ``it`` is not touched
    return _remember(c, (_make_cycle, (it, saved)))


def _make_cycled(saved: list[Any], index: int) -> Any:
    c = itertools.cycle(saved)
    _advance(c, len(saved) + index if saved else 0)
    return _remember(c, (_make_cycled, (saved, index)))


@_reducer("itertools.zip_longest")
def _zip_longest_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    # The reduce writes () for an input that is exhausted (and dropped).
    inputs = tuple(None if type(x) is tuple else x for x in rv[1])
    return (_make_zip_longest, (inputs, rv[2] if len(rv) > 2 else None))


def _make_zip_longest(inputs: tuple[Any, ...], fillvalue: Any) -> Any:
    z = itertools.zip_longest(*(() if x is None else x for x in inputs), fillvalue=fillvalue)
    return _remember(z, (_make_zip_longest, (inputs, fillvalue))) if None in inputs else z


# -- itertools: combinatorics, by rank --------------------------------------------------------


def _rank(kind: str, pools: Any, r: int, state: Any) -> int:
    """Lexicographic rank of the last tuple produced, from the native indices."""
    if kind == "product":
        rank = 0
        for pool, i in zip(pools, state, strict=True):
            rank = rank * len(pool) + i
        return rank
    n = len(pools)
    if kind == "permutations":  # cycles[i] counts down from n - i: a factorial-base digit
        cycles = state[1]
        return sum(((n - i) - cycles[i]) * math.perm(n - i - 1, r - i - 1) for i in range(r))
    idx = list(state)
    if kind == "combinations_with_replacement":  # c[i] + i is a combination of n + r - 1
        n, idx = n + r - 1, [c + i for i, c in enumerate(idx)]
    rank, prev = 0, -1
    for i, c in enumerate(idx):
        rank += sum(math.comb(n - 1 - j, r - 1 - i) for j in range(prev + 1, c))
        prev = c
    return rank


@_reducer("itertools.product")
def _product_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    pools = rv[1]
    if any(len(p) == 0 for p in pools):  # stopped ((),) or an empty pool: nothing more
        return (_exhausted, ("product",))
    consumed = _rank("product", pools, 0, rv[2]) + 1 if len(rv) > 2 and rv[2] is not None else 0
    return (_make_combinatoric, ("product", pools, 0, consumed))


@_reducer("itertools.permutations", "itertools.combinations", "itertools.combinations_with_replacement")
def _combinatoric_reduce(obj: Any, pickler: Any) -> Any:
    kind = type(obj).__name__
    rv = _state(obj)
    pool, r = rv[1]
    if len(rv) > 2 and rv[2] is not None:
        return (_make_combinatoric, (kind, pool, r, _rank(kind, pool, r, rv[2]) + 1))
    empty = r > len(pool) if kind != "combinations_with_replacement" else (not pool and r > 0)
    # A stopped object reduces to ((), r): with r == 0 that reads like a fresh one, which
    # would yield () again; what it holds tells them apart (a result once started).
    if empty or (not pool and r == 0 and len(_refs(obj)) > 1):
        return (_exhausted, (kind,))
    return (_make_combinatoric, (kind, pool, r, 0))


def _make_combinatoric(kind: str, pool: Any, r: int, consumed: int) -> Any:
    obj = itertools.product(*pool) if kind == "product" else getattr(itertools, kind)(pool, r)
    _advance(obj, consumed)
    return obj

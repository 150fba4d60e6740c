"""itertools objects whose state pickling loses (groupby) or never exposed (tee's shared
buffer, pairwise, batched). The decisions are in the table of
:mod:`sojourn.capsule.reducers.iterators`; the helpers are shared with it.
"""

from __future__ import annotations

import copy
import gc
import itertools
import struct
import sys
from typing import Any

from sojourn.capsule.context import current
from sojourn.capsule.reducers.iterators import (
    _PY,
    _advance,
    _exhausted,
    _Prefix,
    _reducer,
    _refs,
    _remember,
    _state,
    _Unreadable,
    _unwrap,
)


def stale_grouper() -> Any:
    """A real ``_grouper`` that is no longer its groupby's current group: it yields nothing."""
    parent = itertools.groupby((None,))
    _, grouper = next(parent)
    next(parent, None)
    return grouper


# -- itertools: groupby and its groups ----------------------------------------------------------


class _FirstKey:
    """A key function that gives a known key for the first item, then defers to ``keyfunc``:
    a rebuilt groupby must not call the user's key function again on an item it already
    keyed (nor on the marker that reopens a half-consumed group)."""

    __slots__ = ("first", "keyfunc", "pending")

    def __init__(self, keyfunc: Any, first: Any) -> None:
        self.keyfunc, self.first, self.pending = keyfunc, first, True

    def __call__(self, value: Any) -> Any:
        if self.pending:
            self.pending, key, self.first = False, self.first, None
            return key
        return value if self.keyfunc is None else self.keyfunc(value)


@_reducer("sojourn.capsule.reducers.iterators_hidden._FirstKey")
def _first_key_reduce(obj: _FirstKey, pickler: Any) -> Any:
    return (_make_first_key, (obj.keyfunc, obj.first, obj.pending))


def _make_first_key(keyfunc: Any, first: Any, pending: bool) -> _FirstKey:
    k = _FirstKey(keyfunc, first)
    k.pending = pending
    return k


_MARK = object()


@_reducer("itertools.groupby")
def _groupby_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    it, keyfunc = rv[1]
    if len(rv) > 2:
        currkey, currvalue, tgtkey = rv[2]
        state: tuple[Any, ...] = (tgtkey, currkey, currvalue)
    else:
        # The reduce drops the group key once the group's grouper took the look-ahead item
        # (next(g) would then replay the rest of that group): read it from the fields.
        refs = _refs(obj)
        if len(refs) not in (2, 3) or refs[0] is not it or refs[1] is not keyfunc:
            raise _Unreadable("this itertools.groupby is in a state sojourn does not know")
        state = tuple(refs[2:])
    if isinstance(keyfunc, _FirstKey) and not keyfunc.pending:
        keyfunc = keyfunc.keyfunc
    return (_make_groupby, (_unwrap(it), keyfunc, state))


def _make_groupby(it: Any, keyfunc: Any, state: tuple[Any, ...]) -> Any:
    if not state:
        return itertools.groupby(it, keyfunc)
    if len(state) == 3:
        tgt, cur, val = state
        g = itertools.groupby(_Prefix((val,), it), _FirstKey(keyfunc, cur))
        if tgt is cur or tgt == cur:  # the look-ahead belongs to the open group: reopen it
            _groupers()[id(g)] = next(g)[1]
    else:
        g = itertools.groupby(_Prefix((_MARK,), it), _FirstKey(keyfunc, state[0]))
        grouper = next(g)[1]
        next(grouper)  # the marker stands for the item the group's grouper already took
        _groupers()[id(g)] = grouper
    return _remember(g, (_make_groupby, (it, keyfunc, state)))


def _groupers() -> dict[int, Any]:
    """Groupers opened by groupby rebuilds during this restore, by id of their groupby."""
    ctx = current()
    found: dict[int, Any] | None = getattr(ctx, "_sojourn_groupers", None)
    if found is None:
        found = {}
        setattr(ctx, "_sojourn_groupers", found)  # noqa: B010  (not a RestoreContext field)
    return found


@_reducer("itertools._grouper")
def _grouper_reduce(obj: Any, pickler: Any) -> Any:
    rv = _state(obj)
    if rv[0] is iter:  # no longer its groupby's current group: yields nothing
        return (_exhausted, ("_grouper",))
    return (_grouper_of, (rv[1][0],))


def _grouper_of(parent: Any) -> Any:
    grouper = _groupers().get(id(parent))
    if grouper is not None:
        return grouper
    # The groupby had already read the first item of the next group: this group is over.
    return _remember(stale_grouper(), (_grouper_of, (parent,)))


# -- itertools: tee --------------------------------------------------------------------------


class _TeeFamily:
    """The tees that share one buffer: the underlying iterator and the values still needed."""

    __slots__ = ("buffer", "it", "root")

    def __init__(self, it: Any, buffer: list[Any]) -> None:
        self.it, self.buffer = it, buffer
        self.root: Any = None


@_reducer("sojourn.capsule.reducers.iterators_hidden._TeeFamily")
def _tee_family_reduce(obj: _TeeFamily, pickler: Any) -> Any:
    return (_make_tee_family, (obj.it, obj.buffer))


def _make_tee_family(it: Any, buffer: list[Any]) -> _TeeFamily:
    fam = _TeeFamily(it, buffer)
    # A root tee that never moves keeps the buffer for the members; it lives only as long
    # as the family, which only the restore holds.
    fam.root = itertools.tee(_Prefix(buffer, it), 1)[0]
    return fam


def _tee_member(fam: _TeeFamily, position: int) -> Any:
    t = copy.copy(fam.root)
    _advance(t, position)
    return _remember(t, (_tee_member, (fam, position)))


@_reducer("itertools._tee")
def _tee_reduce(obj: Any, pickler: Any) -> Any:
    index: dict[int, tuple[_TeeFamily, int]] | None = getattr(pickler, "_sojourn_tees", None)
    if index is None or id(obj) not in index:
        index = _index_tees(obj)
        pickler._sojourn_tees = index
        pickler.keepalive(index)
    fam, position = index[id(obj)]
    return (_tee_member, (fam, position))


def _index_tees(obj: Any) -> dict[int, tuple[_TeeFamily, int]]:
    """Every live tee, by family: the members of one family share the tail of one linked
    list of data links, and a member's position counts from the oldest link still held."""
    members = [o for o in gc.get_objects() if type(o) is type(obj)]
    if not any(m is obj for m in members):
        members.append(obj)
    links: dict[int, tuple[Any, list[Any], Any]] = {}  # id(link) -> (it, values, next link)

    def walk(link: Any) -> list[Any]:
        chain = []
        while link is not None:
            if id(link) not in links:
                _, (it, values, nxt) = _state(link)[:2]
                links[id(link)] = (it, values, nxt)
            chain.append(link)
            link = links[id(link)][2]
        return chain

    by_tail: dict[int, list[tuple[Any, list[Any], int]]] = {}
    for m in members:
        link, index = _state(m)[2]
        chain = walk(link)
        by_tail.setdefault(id(chain[-1]), []).append((m, chain, index))
    out: dict[int, tuple[_TeeFamily, int]] = {}
    for group in by_tail.values():
        head = max(group, key=lambda g: len(g[1]))[1]
        offsets: dict[int, int] = {}
        buffer: list[Any] = []
        for link in head:
            offsets[id(link)] = len(buffer)
            buffer.extend(links[id(link)][1])
        fam = _TeeFamily(_unwrap(links[id(head[-1])][0]), buffer)
        for m, chain, index in group:
            out[id(m)] = (fam, offsets[id(chain[0])] + index)
    return out


@_reducer("itertools._tee_dataobject")
def _tee_data_reduce(obj: Any, pickler: Any) -> Any:
    raise _Unreadable("internal tee data cannot travel on its own; capture the tee objects")


# -- itertools: pairwise and batched (no pickling ever) ------------------------------------------


@_reducer("itertools.pairwise")
def _pairwise_reduce(obj: Any, pickler: Any) -> Any:
    refs, word = _refs(obj), struct.calcsize("P")
    size = type(obj).__basicsize__ - object.__basicsize__
    if size == 3 * word:  # 3.13+ also holds a reusable result pair, always, visited last
        refs = refs[:-1]
    elif size != 2 * word:
        raise _Unreadable(f"itertools.pairwise has an unknown layout on Python {_PY}")
    if not refs:  # its input is exhausted and was dropped
        return (_exhausted, ("pairwise",))
    return (_make_pairwise, (_unwrap(refs[0]), tuple(refs[1:2])))


def _make_pairwise(it: Any, old: tuple[Any, ...]) -> Any:
    if not old:
        return itertools.pairwise(it)
    return _remember(itertools.pairwise(_Prefix(old, it)), (_make_pairwise, (it, old)))


_BATCHED_LAYOUT: list[tuple[int, int | None]] = []  # (offset of n, offset of strict)


def _batched_layout() -> tuple[int, int | None]:
    """Where batched keeps n (and strict): found on probe objects, not assumed."""
    if not _BATCHED_LAYOUT:
        import ctypes

        def bytes_of(o: Any) -> bytes:
            return ctypes.string_at(id(o), type(o).__basicsize__)

        word, head = struct.calcsize("P"), object.__basicsize__
        src, batched = iter(()), getattr(itertools, "batched")  # noqa: B009  (3.12+)
        raw = bytes_of(batched(src, 0x5A17))
        at_n = [off for off in range(head, len(raw) - word + 1, word)
                if int.from_bytes(raw[off : off + word], sys.byteorder, signed=True) == 0x5A17]
        at_strict: int | None = None
        try:
            strict = bytes_of(batched(src, 0x5A17, strict=True))
        except TypeError:  # 3.12: no strict mode
            pass
        else:
            flips = [off for off in range(head, len(raw)) if (raw[off], strict[off]) == (0, 1)]
            at_strict = flips[0] if len(flips) == 1 else -1
        if len(at_n) != 1 or at_strict == -1:
            raise _Unreadable(f"itertools.batched has an unknown layout on Python {_PY}")
        _BATCHED_LAYOUT.append((at_n[0], at_strict))
    return _BATCHED_LAYOUT[0]


@_reducer("itertools.batched")
def _batched_reduce(obj: Any, pickler: Any) -> Any:
    import ctypes

    at_n, at_strict = _batched_layout()
    refs = _refs(obj)
    if not refs:  # its input is exhausted and was dropped
        return (_exhausted, ("batched",))
    raw = ctypes.string_at(id(obj), type(obj).__basicsize__)
    n = int.from_bytes(raw[at_n : at_n + struct.calcsize("P")], sys.byteorder, signed=True)
    strict = at_strict is not None and bool(raw[at_strict])
    return (make_batched, (refs[0], n, strict))


class _Batched:
    """``itertools.batched`` where the destination lacks it (3.11) or its strict mode (3.12)."""

    __slots__ = ("it", "n", "strict")

    def __init__(self, it: Any, n: int, strict: bool) -> None:
        self.it: Any = iter(it)
        self.n, self.strict = n, strict

    def __iter__(self) -> _Batched:
        return self

    def __next__(self) -> tuple[Any, ...]:
        if self.it is None:
            raise StopIteration
        batch = tuple(itertools.islice(self.it, self.n))
        if not batch or (self.strict and len(batch) != self.n):
            self.it = None
            if batch:
                raise ValueError("batched(): incomplete batch")
            raise StopIteration
        return batch


@_reducer("sojourn.capsule.reducers.iterators_hidden._Batched")
def _batched_emulation_reduce(obj: _Batched, pickler: Any) -> Any:
    if obj.it is None:
        return (_exhausted, ("batched",))
    return (make_batched, (obj.it, obj.n, obj.strict))


def make_batched(it: Any, n: int, strict: bool) -> Any:
    native = getattr(itertools, "batched", None)
    if native is not None:
        try:
            return native(it, n, strict=True) if strict else native(it, n)
        except TypeError:  # 3.12: no strict mode
            pass
    return _Batched(it, n, strict)

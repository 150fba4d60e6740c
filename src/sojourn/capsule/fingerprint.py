"""Fingerprints: one per top-level variable, over its content and aliasing structure.

A variable's fingerprint is the BLAKE3 hash of its exact segment of the capsule stream
(values, types, and, through pickle's memo, which objects are the same object) followed by
the chunk hashes of the buffers it owns. Computing it costs one hash over bytes that capture
produces anyway. Tensor devices are kept out of the stream (in a side table), so the
stream does not depend on where a tensor lived.

Restore checks that the *restored objects* are the captured ones: it pickles them again
with the same pickler and compares. Most of the time the bytes are identical. Two things
can make them differ without any value differing, and neither is something a user can see:
the identity of equal strings (CPython interns some strings and not others, differently in
each process) and the iteration order of sets (string hashing is randomised per process).
When bytes differ, both streams are read by :func:`canonical_digests`, a symbolic reader
that interprets pickle opcodes without creating any object or running any code, and builds
a canonical form in which strings and bytes are values, sets are sorted, and every other
shared object is a numbered back-reference. The restore is refused only if the canonical
forms differ.
"""

from __future__ import annotations

import pickletools
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import blake3

from sojourn.repository.chunks import DEFAULT_CHUNK_SIZE, chunk_hash


def segment_fingerprint(segment: bytes | memoryview, buffer_hashes: Sequence[Sequence[str]]) -> str:
    h = blake3.blake3(b"sojourn-fp-1\0")
    h.update(segment)
    for hashes in buffer_hashes:
        h.update(b"\0buf")
        for c in hashes:
            h.update(c.encode())
    return h.hexdigest()[:32]


def hash_pieces(view: memoryview, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[str]:
    v = view.cast("B") if (view.ndim != 1 or view.format != "B") else view
    return [chunk_hash(v[i : i + chunk_size]) for i in range(0, len(v), chunk_size)]


# -- the symbolic reader ----------------------------------------------------------------------


class _Node:
    """A container or reduced object in the symbolic stream (compared by identity)."""

    __slots__ = ("items", "kind")

    def __init__(self, kind: str, items: list[Any] | None = None):
        self.kind = kind
        self.items = items if items is not None else []


_MARK = object()


def _pop_mark(stack: list[Any]) -> list[Any]:
    i = len(stack) - 1
    while stack[i] is not _MARK:
        i -= 1
    items = stack[i + 1 :]
    del stack[i:]
    return items


def canonical_digests(
    stream: bytes | memoryview,
    segments: Sequence[tuple[int, int]],
    buffer_hashes: Sequence[Sequence[str]],
    wanted: set[int],
    *,
    first: int = 0,
    base: int = 0,
    extern: Callable[[int], Any] | None = None,
    values: dict[int, Any] | None = None,
) -> dict[int, str]:
    """Canonical digests of the values of the ``wanted`` segments of ``stream``.

    By default the whole stream is read. With ``first``, reading starts at that segment:
    its memo starts at index ``base`` (the entries the segments before it made), and
    ``buffer_hashes`` starts with that segment's first buffer; a reference to an earlier
    entry is ``extern(index)``, a canonical stand-in for it (see :func:`extern_token`).
    """
    memo: dict[int, Any] = {}
    next_index = base
    buffers = iter(buffer_hashes)
    out: dict[int, str] = {}
    data = bytes(stream)
    for index, (start, end) in enumerate(segments):
        if index < first:
            continue
        stack: list[Any] = []
        value: Any = None
        arg: Any
        for op, arg, _pos in pickletools.genops(data[start:end]):
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                value = stack.pop()
                break
            if name == "MEMOIZE":
                memo[next_index] = stack[-1]
                next_index += 1
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                if arg in memo:
                    stack.append(memo[arg])
                elif extern is not None and arg < base:
                    stack.append(extern(arg))
                else:
                    raise ValueError(f"the stream refers to memo entry {arg}, which it never made")
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[arg] = stack[-1]
                next_index = max(next_index, arg + 1)
            elif name == "MARK":
                stack.append(_MARK)
            elif name == "EMPTY_LIST":
                stack.append(_Node("list"))
            elif name == "EMPTY_DICT":
                stack.append(_Node("dict"))
            elif name == "EMPTY_SET":
                stack.append(_Node("set"))
            elif name == "EMPTY_TUPLE":
                stack.append(("tuple",))
            elif name == "APPEND":
                v = stack.pop()
                stack[-1].items.append(v)
            elif name in ("APPENDS", "ADDITEMS"):
                items = _pop_mark(stack)
                stack[-1].items.extend(items)
            elif name == "SETITEM":
                v = stack.pop()
                k = stack.pop()
                stack[-1].items.append((k, v))
            elif name == "SETITEMS":
                items = _pop_mark(stack)
                stack[-1].items.extend(zip(items[::2], items[1::2], strict=True))
            elif name in ("LIST", "DICT"):
                items = _pop_mark(stack)
                node = _Node(name.lower(), items if name == "LIST" else list(zip(items[::2], items[1::2], strict=True)))
                stack.append(node)
            elif name == "TUPLE":
                stack.append(("tuple", *_pop_mark(stack)))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = stack[-n:]
                del stack[-n:]
                stack.append(("tuple", *items))
            elif name == "FROZENSET":
                stack.append(_Node("frozenset", _pop_mark(stack)))
            elif name in ("STACK_GLOBAL",):
                qual = stack.pop()
                mod = stack.pop()
                stack.append(_global(mod, qual))
            elif name == "GLOBAL":
                mod, _, qual = arg.partition(" ")
                stack.append(_global(mod, qual))
            elif name in ("REDUCE", "NEWOBJ"):
                args = stack.pop()
                fn = stack.pop()
                stack.append(_Node(name.lower(), [fn, args]))
            elif name == "NEWOBJ_EX":
                kwargs = stack.pop()
                args = stack.pop()
                cls = stack.pop()
                stack.append(_Node("newobj", [cls, args, kwargs]))
            elif name == "BUILD":
                state = stack.pop()
                stack[-1].items.append(("build", state))
            elif name == "NEXT_BUFFER":
                stack.append(("buffer", *next(buffers)))
            elif name == "READONLY_BUFFER":
                continue
            elif name == "POP":
                popped = stack.pop()
                # A reduce whose result is dropped ran for its effect: pickle's call of a
                # state_setter(obj, state). That state is part of obj's content.
                if isinstance(popped, _Node) and popped.kind == "reduce":
                    args = popped.items[1]
                    if isinstance(args, tuple) and len(args) == 3 and isinstance(args[1], _Node):
                        args[1].items.append(("setstate", popped))
            elif name == "POP_MARK":
                _pop_mark(stack)
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
            elif name in ("BINPERSID", "PERSID"):
                pid = stack.pop() if name == "BINPERSID" else arg
                stack.append(("persid", pid))
            elif name in ("EXT1", "EXT2", "EXT4"):
                stack.append(("ext", arg))
            else:
                # Every remaining opcode pushes one atom decoded by pickletools (ints,
                # floats, strings, bytes, bytearrays).
                stack.append(("bytearray", bytes(arg)) if name == "BYTEARRAY8" else arg)
        if index in wanted:
            out[index] = _digest(value)
            if values is not None:
                values[index] = value
    return out


def difference(a: Any, b: Any) -> str:
    """Where two symbolic values (from :func:`canonical_digests`' ``values``) first differ, as
    a path: ``[key]`` for items, ``.name`` for an object's state, ``(args)`` for what made it.
    Empty when they differ at the top or not at all."""
    path = ""
    seen: set[int] = set()
    while id(a) not in seen:
        seen.add(id(a))
        step = _first_differing(a, b)
        if step is None:
            return path
        label, a, b = step
        path += label
    return path


def _first_differing(a: Any, b: Any) -> tuple[str, Any, Any] | None:
    if isinstance(a, _Node) and isinstance(b, _Node) and a.kind == b.kind and a.kind not in ("set", "frozenset"):
        if a.kind == "dict":
            pairs = list(zip(a.items, b.items, strict=False))
            for (ka, va), (kb, vb) in pairs:
                if _digest(ka) != _digest(kb):
                    return None
                if _digest(va) != _digest(vb):
                    return (f"[{ka!r}]" if isinstance(ka, str | int) else "[…]", va, vb)
            longer = a.items if len(a.items) > len(b.items) else b.items
            if len(a.items) != len(b.items):  # an entry one side has and the other lacks
                k = longer[len(pairs)][0]
                return (f"[{k!r}]" if isinstance(k, str | int) else "[…]", None, None)
            return None
        for i, (x, y) in enumerate(zip(a.items, b.items, strict=False)):
            if _digest(x) == _digest(y):
                continue
            if a.kind in ("reduce", "newobj"):
                if i == 1:
                    return ("(…)", x, y)
                if isinstance(x, tuple) and isinstance(y, tuple) and x[:1] == y[:1] == ("build",):
                    return _state_step(x[1], y[1])
                if isinstance(x, tuple) and isinstance(y, tuple) and x[:1] == y[:1] == ("setstate",):
                    # state_setter(obj, state): the state is the call's third argument
                    sa, sb = x[1].items[1], y[1].items[1]
                    if isinstance(sa, tuple) and isinstance(sb, tuple) and len(sa) == len(sb) == 3:
                        return _state_step(sa[2], sb[2])
                return None
            return (f"[{i}]", x, y)
        return None
    if isinstance(a, tuple) and isinstance(b, tuple) and a[:1] == b[:1] == ("tuple",) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a[1:], b[1:], strict=True)):
            if _digest(x) != _digest(y):
                return (f"[{i}]", x, y)
    return None


def _state_step(a: Any, b: Any) -> tuple[str, Any, Any] | None:
    """An object's BUILD state: its attribute dict (or (dict, slots)) names attributes."""
    if isinstance(a, tuple) and isinstance(b, tuple) and a[:1] == b[:1] == ("tuple",) and len(a) == len(b) == 3:
        for x, y in zip(a[1:], b[1:], strict=True):
            if _digest(x) != _digest(y):
                a, b = x, y
                break
    if isinstance(a, _Node) and isinstance(b, _Node) and a.kind == b.kind == "dict":
        step = _first_differing(a, b)
        if step is not None and step[0].startswith("['") and step[0].endswith("']"):
            return ("." + step[0][2:-2], step[1], step[2])
        return step
    return None


def _global(mod: Any, qual: Any) -> tuple[Any, ...]:
    """A global by the name its object gives itself, where this process has it.

    Two Python versions may name one class from two modules (``pathlib.Path`` on 3.12 is
    ``pathlib._local.Path`` on 3.13): both streams' names are looked up in the modules
    already imported (dictionaries only: no import, no module ``__getattr__`` runs) and an
    object found is named by its own ``__module__`` and ``__qualname__``."""
    if not isinstance(mod, str) or not isinstance(qual, str):
        return ("global", mod, qual)
    obj: Any = sys.modules.get(mod)
    for part in qual.split("."):
        space = getattr(obj, "__dict__", None)
        obj = space.get(part) if space is not None and hasattr(space, "get") else None
        if obj is None:
            return ("global", mod, qual)
    if not isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType):
        return ("global", mod, qual)  # an instance's attributes could run its code
    own_mod, own_qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(own_mod, str) and isinstance(own_qual, str) and (own_mod, own_qual) != (mod, qual):
        return ("global", own_mod, own_qual)
    return ("global", mod, qual)


def extern_token(obj: Any, index: int) -> Any:
    """How a segment read on its own sees an object that an earlier segment made.

    Strings and bytes are values (their identity is not part of the content, as in the
    whole-stream reading); anything else is "the object at memo ``index``", which the
    caller must know to be the same object in both streams (the streams are identical up
    to the first segment read).
    """
    if type(obj) in (str, bytes):
        return obj
    if type(obj) is bytearray:
        return ("bytearray", bytes(obj))
    return ("extern", index)


def _digest(value: Any) -> str:
    # The canonical form is gathered into one list and hashed once: one hash update per atom
    # cost half of the comparison's time on a model's state.
    out: list[bytes] = [b"sojourn-canon-1\0"]
    _emit(value, out, {})
    return blake3.blake3(b"".join(out)).hexdigest()[:32]


def _emit(value: Any, out: list[bytes], seen: dict[int, int]) -> None:
    # Iterative would be faster but recursion mirrors the structure; depth equals nesting.
    if isinstance(value, _Node):
        ref = seen.get(id(value))
        if ref is not None:
            out.append(b"R%d;" % ref)
            return
        seen[id(value)] = len(seen)
        out.append(b"N" + value.kind.encode() + b"(")
        if value.kind in ("set", "frozenset"):
            parts = []
            for item in value.items:
                sub: list[bytes] = []
                _emit(item, sub, {})
                parts.append(blake3.blake3(b"".join(sub)).digest())
            out.extend(sorted(parts))
        else:
            for item in value.items:
                _emit(item, out, seen)
        out.append(b")")
    elif isinstance(value, tuple):
        out.append(b"T(")
        for item in value:
            _emit(item, out, seen)
        out.append(b")")
    elif isinstance(value, str):
        b = value.encode("utf-8", "surrogatepass")
        out.append(b"S%d:" % len(b))
        out.append(b)
    elif isinstance(value, bytes | bytearray):
        out.append(b"B%d:" % len(value))
        out.append(bytes(value))
    else:
        out.append(type(value).__name__.encode() + b":" + repr(value).encode() + b";")

"""Reading little-endian capsules on a big-endian machine.

Capsules are little-endian on every machine (see ``docs/capsule-format.md``, *Byte order*).
Most of what they hold is portable by itself (pickle writes ints and floats in a fixed
order) or goes through sojourn's own reducers, which convert. What does not: objects that
pickle themselves with raw native bytes and rebuild through the library's own functions,
such as numpy's dtypes (their state names a byte order), numpy scalars and arrays of
ndarray subclasses (their state holds the bytes), ``array.array``. On a big-endian
machine the reducers write them as a little-endian machine would, and restore reads them
with :class:`BigEndianUnpickler`, which translates those few globals and ``BUILD`` states
before the library sees them. On a little-endian machine nothing here runs: restore uses
pickle's C unpickler as it is.

The pure-Python unpickler costs a few times the C one's time per object; a big-endian
restore pays it (arrays' bytes do not pass through the stream).
"""

from __future__ import annotations

import array
import pickle
import sys
from collections.abc import Callable, Iterable
from typing import Any

from sojourn.capsule.registry import register

LITTLE = sys.byteorder == "little"

# (module, name) -> what a big-endian restore uses instead.
_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {}
# BUILD hooks: hook(instance, state) -> True when it set the state itself.
_BUILD_HOOKS: list[Callable[[Any, Any], bool]] = []


def translate_global(module: str, name: str, replacement: Callable[..., Any]) -> None:
    _GLOBALS[(module, name)] = replacement


def build_hook(fn: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    _BUILD_HOOKS.append(fn)
    return fn


_PyUnpickler: Any = pickle._Unpickler  # type: ignore[attr-defined]


class BigEndianUnpickler(_PyUnpickler):  # type: ignore[misc]
    """pickle's own unpickler, reading a little-endian capsule's stream on a big-endian machine."""

    dispatch = dict(_PyUnpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        hit = _GLOBALS.get((module, name))
        return hit if hit is not None else super().find_class(module, name)

    def load_build(self) -> None:
        state = self.stack[-1]
        inst = self.stack[-2]
        for hook in _BUILD_HOOKS:
            if hook(inst, state):
                self.stack.pop()
                return
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def unpickler(file: Any, buffers: Iterable[Any]) -> Any:
    """The unpickler for a capsule's stream on this machine."""
    if LITTLE:
        return pickle.Unpickler(file, buffers=buffers)
    return BigEndianUnpickler(file, buffers=buffers)


# -- array.array --------------------------------------------------------------------------------
#
# array.array pickles as (typecode, machine format code, raw bytes) and its reconstructor
# converts from any format code: a big-endian machine writes the little-endian code (for
# items of two bytes or more it is the big-endian one minus one) and swapped bytes.

if not LITTLE:

    @register("array.array")
    def _array_reduce(obj: Any, pickler: Any) -> Any:
        rv = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        fn, args = rv[0], rv[1]
        if obj.itemsize < 2 or len(args) != 4 or not isinstance(args[3], bytes) or args[2] % 2 == 0:
            return rv
        swapped = array.array(obj.typecode, obj)
        swapped.byteswap()
        return (fn, (args[0], args[1], args[2] - 1, swapped.tobytes()), *rv[2:])

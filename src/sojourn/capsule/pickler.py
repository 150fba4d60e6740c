"""The capsule pickler: pickle protocol 5, one memo for the whole namespace, one reducer table.

Every object that is not a builtin container or atom passes through
:meth:`CapsulePickler.reducer_override`, which

1. asks the dispatch table (:mod:`sojourn.capsule.registry`) for a reducer by type;
2. routes functions and classes to the code reducer (user code travels as source);
3. refuses what cannot travel (threads, sockets, held locks, ...) by *recording* a problem
   and carrying on, so that one capture reports every such object, not just the first;
4. otherwise calls the object's own ``__reduce_ex__`` itself, so that an object whose
   reduction fails is caught here, with the object in hand, rather than deep in C.

Large buffers leave the stream out of band (``PickleBuffer``); a reducer can tag a buffer
with a kind and metadata so that restore allocates the final object before unpickling.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import types
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sojourn.capsule import registry

PROTOCOL = 5


@dataclass
class BufferOut:
    view: memoryview
    kind: str  # "raw" or an allocator kind such as "ndarray"
    meta: dict[str, Any]
    owner: Any  # keeps the exporting object alive until the chunks are written


@dataclass
class CaptureContext:
    """What one capture learns while pickling."""

    workspace: Path | None = None
    namespace: dict[str, Any] | None = None
    problems: list[tuple[Any, str]] = field(default_factory=list)
    modules: set[str] = field(default_factory=set)  # top-level modules referenced
    # top-level module -> the variables whose pickles refer to it (the manifest's ``needs``)
    module_users: dict[str, list[str]] = field(default_factory=dict)
    variable: str | None = None  # the variable being pickled
    user_modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    fingerprint_only: bool = False
    # The variable being pickled, and for each problem the variable it was found in: the
    # place to name when the object itself is out of the walk's reach (a reducer made it).
    current_root: str | None = None
    problem_roots: dict[int, str] = field(default_factory=dict)


def _unsupported(type_name: str) -> None:
    raise pickle.UnpicklingError(f"a placeholder for an unsupported {type_name} was unpickled")


class _BufferSink:
    """The pickler's buffer callback: every buffer goes out of band, with its tag."""

    def __init__(self) -> None:
        self.buffers: list[BufferOut] = []
        self.tagged: dict[int, tuple[pickle.PickleBuffer, str, dict[str, Any], Any]] = {}

    def __call__(self, pb: pickle.PickleBuffer) -> bool:
        tag = self.tagged.pop(id(pb), None)
        meta: dict[str, Any]
        if tag is None:
            kind, meta, owner = "raw", {}, pb
        else:
            _, kind, meta, owner = tag
        self.buffers.append(BufferOut(pb.raw(), kind, meta, owner))
        return False  # never in-band


class _Capsule:
    """What both capsule picklers do (the C one, and the pure-Python one for deep graphs)."""

    _base: Any = pickle.Pickler

    def __init__(self, file: io.BufferedIOBase | io.BytesIO, ctx: CaptureContext):
        # The buffer callback is an object of its own, not a method of the pickler: a
        # pickler holding its own bound method is a cycle, and its memo (every pickled
        # object, arrays too) would live until the cyclic collector ran.
        sink = _BufferSink()
        self._base.__init__(self, file, protocol=PROTOCOL, buffer_callback=sink)
        # Whoever pickles gets every reducer: importing the package registers them (once).
        from sojourn.capsule import reducers  # noqa: F401

        self.ctx = ctx
        self.buffers: list[BufferOut] = sink.buffers
        self._tagged = sink.tagged
        self._keep: list[Any] = []
        self._shared_globals: dict[int, dict[str, Any]] = {}
        # Types that take the generic path -> the variable (number) their module was last
        # noted for (-1: never): noted once per type and variable, not once per object.
        self._generic: dict[type, int] = {}
        self._variable = 0

    # -- out-of-band buffers ------------------------------------------------------------------

    def out_of_band(self, owner: Any, kind: str = "raw", meta: dict[str, Any] | None = None) -> pickle.PickleBuffer:
        """A ``PickleBuffer`` over ``owner`` whose restore allocator is ``kind``."""
        pb = pickle.PickleBuffer(owner)
        self._tagged[id(pb)] = (pb, kind, meta or {}, owner)
        return pb

    # -- problems -------------------------------------------------------------------------------

    def problem(self, obj: Any, reason: str) -> tuple[Any, ...]:
        """Record that ``obj`` cannot travel and return a placeholder so pickling goes on."""
        self.ctx.problems.append((obj, reason))
        if self.ctx.current_root is not None:
            self.ctx.problem_roots.setdefault(id(obj), self.ctx.current_root)
        return (_unsupported, (registry.type_name(type(obj)),))

    def _registered(self, obj: Any, t: type) -> Any:
        """An object of the program's own class whose reducer the program registered with
        ``copyreg.pickle``: the registration travels with it (the restored class has none
        otherwise, and would pickle, and check, another way)."""
        fn = copyreg.dispatch_table[t]
        try:
            rv = fn(obj)
        except Exception as e:
            return self.problem(obj, f"its reducer registered with copyreg fails: {e}")
        if not isinstance(rv, tuple) or not 2 <= len(rv) <= 6 or not callable(rv[0]):
            return NotImplemented  # a global's name, or a shape pickle itself will judge
        return (_copyreg_made, (t, fn, rv[0], rv[1]), *rv[2:])

    def release(self) -> None:
        """Drop the memo and what it kept alive (the buffers stay: they are still to be written)."""
        self.clear_memo()  # type: ignore[attr-defined]
        self._keep.clear()
        self._shared_globals.clear()
        self._tagged.clear()

    def keepalive(self, obj: Any) -> None:
        self._keep.append(obj)

    def begin_variable(self, name: str) -> None:
        """The next ``dump`` pickles variable ``name``: modules noted from now on are its."""
        self.ctx.variable = name
        self._variable += 1

    def note_module(self, module_name: str | None) -> None:
        if module_name:
            top = module_name.partition(".")[0]
            self.ctx.modules.add(top)
            var = self.ctx.variable
            if var is not None:
                users = self.ctx.module_users.setdefault(top, [])
                if not users or users[-1] != var:
                    users.append(var)

    # -- the override -----------------------------------------------------------------------------

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t not in self._generic:
            reducer = registry.lookup(t)
            if reducer is not None:
                return reducer(obj, self)
            if isinstance(obj, type):
                from sojourn.capsule.reducers import code

                return code.reduce_class(obj, self)
            if t is types.FunctionType:
                from sojourn.capsule.reducers import code

                return code.reduce_function(obj, self)
            if t in copyreg.dispatch_table and _program_type(t):
                return self._registered(obj, t)
            if t in _NATIVE or t in copyreg.dispatch_table:
                return NotImplemented
            reason = _refusal(obj)
            if reason is not None:
                return self.problem(obj, reason)
            # Every test above depends on the type alone: the next object of this type (there
            # are often 10^5 of them) goes straight to its own __reduce_ex__.
            self._generic[t] = -1
        try:
            rv = obj.__reduce_ex__(PROTOCOL)
        except RecursionError:
            raise  # a graph too deep for this stack: the caller pickles it again, deeply()
        except Exception as e:
            return self.problem(obj, _explain(obj, e))
        if isinstance(rv, tuple):
            if not 2 <= len(rv) <= 6 or not callable(rv[0]):
                # pickle would raise deep in C with no word of which object it was
                return self.problem(obj, f"its __reduce__ returned a tuple pickle cannot use ({_bad_tuple(rv)})")
            if rv:
                if self._generic[t] != self._variable:
                    self._generic[t] = self._variable
                    self.note_module(getattr(t, "__module__", None))
                if len(rv) >= 3:
                    return _exact_build(t, rv)
            return rv
        if isinstance(rv, str):
            self.note_module(getattr(obj, "__module__", None))
            return NotImplemented  # a global: pickle looks it up by name
        return self.problem(obj, f"its __reduce__ returned {type(rv).__name__}, not a tuple or a global's name")


class CapsulePickler(_Capsule, pickle.Pickler):
    _base = pickle.Pickler


class DeepCapsulePickler(_Capsule, pickle._Pickler):  # type: ignore[name-defined,misc]
    """The same pickler over pickle's pure-Python one. CPython 3.12's C pickler stops at a
    fixed C recursion depth that no recursion limit raises; Python frames only need the limit
    and a big enough thread stack (:func:`deeply`). Slower: only for graphs the C one cannot
    walk (a linked list of 100 000 nodes)."""

    _base = pickle._Pickler  # type: ignore[attr-defined]

    def reducer_override(self, obj: Any) -> Any:
        # The C pickler writes these itself before it asks reducer_override; the Python one
        # asks first, and an str's own __reduce_ex__ would lead back to str.
        if type(obj) in _C_FIRST:
            return NotImplemented
        return super().reducer_override(obj)

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        # pickle.py's save() calls save_reduce(obj=obj, *rv): a call through C, which 3.12
        # and 3.13 count against their fixed C recursion limit. Plain Python-to-Python calls
        # do not count, so a reduce tuple is saved here with one; the rest is pickle's own.
        if type(obj) not in _C_FIRST and id(obj) not in self.memo:  # type: ignore[attr-defined]
            rv = self.reducer_override(obj)
            if type(rv) is tuple and 2 <= len(rv) <= 6:
                self.framer.commit_frame()  # type: ignore[attr-defined]
                rv = rv + (None,) * (6 - len(rv))
                self.save_reduce(rv[0], rv[1], rv[2], rv[3], rv[4], rv[5], obj=obj)  # type: ignore[attr-defined]
                return
        _py_save(self, obj, save_persistent_id)


_py_save = pickle._Pickler.save  # type: ignore[attr-defined]
_C_FIRST = {type(None), bool, int, float, bytes, bytearray, str, tuple, list, dict, set, frozenset,
            pickle.PickleBuffer}


# A linked structure of about 200 000 nodes (pickle's Python pickler takes about five frames a
# node). The limit keeps 2 KiB of stack a level: what a recursion through C code (a
# __getattribute__ that calls getattr) takes on 3.11, so a runaway recursion is a
# RecursionError, not a crash. The stack is reserved address space, touched only as deep as
# the walk goes; where the system refuses that much (`ulimit -v`), a smaller one with a limit
# to match.
DEEP_STACKS = (2 << 30, 256 << 20, 32 << 20)
BYTES_PER_LEVEL = 2048


class NoDeepStack(RecursionError):
    """No thread with a stack deeper than the caller's could be started."""


def deeply(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a thread with a big stack and a recursion limit to match
    (a deeply nested graph pickles there instead of raising a bare RecursionError)."""
    import contextvars
    import threading

    out: dict[str, Any] = {}
    run = contextvars.copy_context().run  # the restore's context travels with the call

    def body() -> None:
        try:
            out["value"] = run(fn, *args, **kwargs)
        except BaseException as e:  # re-raised in the caller's thread
            out["error"] = e

    old_stack, old_limit = threading.stack_size(), sys.getrecursionlimit()
    t = None
    for size in DEEP_STACKS:
        try:
            threading.stack_size(size)
            t = threading.Thread(target=body, name="sojourn-deep-pickle")
            sys.setrecursionlimit(max(old_limit, size // BYTES_PER_LEVEL))
            t.start()
            break
        except (RuntimeError, ValueError, MemoryError):
            sys.setrecursionlimit(old_limit)
            t = None
        finally:
            threading.stack_size(old_stack)
    if t is None:
        raise NoDeepStack("no thread with a stack deep enough could be started")
    try:
        t.join()
    finally:
        sys.setrecursionlimit(old_limit)
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- identity-exact default state --------------------------------------------------------------
#
# pickle's BUILD, for an object without __setstate__, interns every key of the state dict
# as it copies it into the instance dict. A string that the stream shares (one memo entry)
# between an attribute name and another place (a plain dict key, a list item) then comes
# back as two objects, and the restored graph no longer pickles to the captured bytes: the
# fingerprint check falls back to its slow symbolic comparison. Restoring the default state
# through a state_setter that does what BUILD does, without interning, keeps the identity of
# every string exactly as the stream has it.


def _exact_build(t: type, rv: tuple[Any, ...]) -> tuple[Any, ...]:
    state = rv[2]
    if len(rv) > 5 and rv[5] is not None:
        return rv
    if type(state) is dict:
        if "__setstate__" in state:
            return rv
    elif not (
        type(state) is tuple and len(state) == 2 and (state[0] is None or type(state[0]) is dict)
        and type(state[1]) is dict
    ):
        return rv  # None (no state) or a state only the object's own __setstate__ reads
    if not _plain_build(t):
        return rv
    if type(state) is tuple and state[1]:
        names = _SLOT_NAMES.get(t)
        if names:
            # Slot names come from the class, not from the object: after a restore, use the
            # string objects the stream gave them (see _dict_setstate).
            state = (state[0], {names.get(k, k): v for k, v in state[1].items()})
    n = len(rv)
    return (rv[0], rv[1], state, rv[3] if n > 3 else None, rv[4] if n > 4 else None, _dict_setstate)


_PLAIN_BUILD: dict[type, bool] = {}


def _plain_build(t: type) -> bool:
    """True when BUILD on ``t``'s instances is the default dict update (no __setstate__)."""
    try:
        return _PLAIN_BUILD[t]
    except KeyError:
        pass
    # BUILD looks __setstate__ up on the instance: a Python __getattribute__ or __getattr__
    # could answer, so only types with C attribute lookup and no __getattr__ qualify.
    plain = (
        getattr(t, "__setstate__", None) is None
        and getattr(t, "__getattr__", None) is None
        and isinstance(t.__getattribute__, types.WrapperDescriptorType)
    )
    _PLAIN_BUILD[t] = plain
    return plain


def _dict_setstate(obj: Any, state: Any) -> None:
    """pickle's default BUILD for an object without ``__setstate__``, minus key interning."""
    slots = None
    if type(state) is tuple:
        state, slots = state
    if state:
        d = obj.__dict__
        if d:
            d.update(state)
        else:
            try:
                # The stream's dict becomes the instance dict: an alias to ``obj.__dict__``
                # elsewhere in the graph stays an alias.
                obj.__dict__ = state
            except (AttributeError, TypeError):
                d.update(state)
    if slots:
        names = _SLOT_NAMES.get(type(obj))
        if names is None:
            names = _SLOT_NAMES[type(obj)] = {}
        for k, v in slots.items():
            names[k] = k
            setattr(obj, k, v)


# A class -> its slot names as the last restored stream spelled them (same string objects).
_SLOT_NAMES: weakref.WeakKeyDictionary[type, dict[str, str]] = weakref.WeakKeyDictionary()


# Types whose pickling the C pickler does best on its own.
_NATIVE: set[type] = {
    types.BuiltinFunctionType,
    types.BuiltinMethodType,
    type(None),
    types.EllipsisType,
    types.NotImplementedType,
    complex,
    range,
    slice,
}


def _program_type(t: type) -> bool:
    from sojourn.capsule.source import is_library_module

    return not is_library_module(getattr(t, "__module__", None))


def _copyreg_made(t: type, fn: Any, func: Any, args: tuple[Any, ...]) -> Any:
    """Register ``fn`` for ``t`` again where it is restored, then make the object."""
    copyreg.pickle(t, fn)
    return func(*args)


def _bad_tuple(rv: tuple[Any, ...]) -> str:
    if not 2 <= len(rv) <= 6:
        return f"{len(rv)} items, not 2 to 6"
    return f"its first item, a {type(rv[0]).__name__}, is not callable"


def _explain(obj: Any, exc: Exception) -> str:
    msg = str(exc) or type(exc).__name__
    return f"it has no reducer and its own pickling fails: {msg}"


# Reasons, by base type, for objects that never travel. Checked with isinstance, but only
# against modules already imported: scanning must not import anything.
_REFUSED: list[tuple[str, str, str]] = [
    ("threading", "Thread", "a running thread cannot be moved; join it before the pause, or "
     "start it again after resume"),
    ("socket", "socket", "a network socket is tied to this machine's connections; close it "
     "and reconnect after resume"),
    ("subprocess", "Popen", "a child process stays on this machine; wait for it or restart it "
     "after resume"),
    ("multiprocessing.process", "BaseProcess", "a child process stays on this machine"),
    ("multiprocessing.pool", "Pool", "a process pool stays on this machine; close it and "
     "create it again after resume"),
    ("concurrent.futures", "Executor", "an executor owns threads or processes; shut it down "
     "and create it again after resume"),
    ("asyncio", "AbstractEventLoop", "an event loop owns this machine's file descriptors"),
    ("sqlite3", "Connection", "a database connection is tied to this process; reconnect after "
     "resume"),
    ("selectors", "BaseSelector", "a selector watches this process's file descriptors"),
    ("mmap", "mmap", "a memory map is tied to this process; copy the data into an array"),
    ("ssl", "SSLContext", "TLS state is tied to this process"),
    # No serializer can carry these: the running state lives inside OpenSSL (or the C
    # library), which offers no way to read it out or set it.
    ("_hashlib", "HASH", "a hash object's running state lives inside OpenSSL and cannot be read out; "
     "keep its digest(), or hash the data again after resume"),
    ("_hashlib", "HMAC", "an HMAC's running state lives inside OpenSSL and cannot be read out; "
     "hash the data again after resume"),
    ("_blake2", "blake2b", "a BLAKE2 hash's running state cannot be read out; keep its digest(), or "
     "hash the data again after resume"),
    ("_blake2", "blake2s", "a BLAKE2 hash's running state cannot be read out; keep its digest(), or "
     "hash the data again after resume"),
]


_REFUSAL_CACHE: dict[type, str | None] = {}


def _refusal(obj: Any) -> str | None:
    # By type, cached: a type created before a module was imported cannot derive from it.
    t = type(obj)
    try:
        return _REFUSAL_CACHE[t]
    except KeyError:
        pass
    reason = _refusal_uncached(obj)
    _REFUSAL_CACHE[t] = reason
    return reason


def _refusal_uncached(obj: Any) -> str | None:
    if isinstance(obj, types.FrameType | types.TracebackType):
        return "interpreter frames and tracebacks are tied to this process"
    if isinstance(obj, types.GeneratorType | types.CoroutineType | types.AsyncGeneratorType):
        return (
            "a generator or coroutine cannot be captured by sojourn.capture(); run the program "
            "under `sojourn run` (in a notebook: %load_ext sojourn), which resumes generator "
            "functions of the program (of its cells) from their source"
        )
    if isinstance(obj, types.CodeType):
        return "bytecode does not travel between Python versions; capture the function instead"
    for mod, name, reason in _REFUSED:
        m = sys.modules.get(mod)
        base = getattr(m, name, None) if m is not None else None
        if isinstance(base, type) and isinstance(obj, base):
            return reason
    return None

"""User code travels as source; library code travels by reference.

Bytecode does not survive a change of Python minor version (a lambda pickled by
cloudpickle on 3.11 crashes 3.13), source does. So:

* a function or class from a *library* (stdlib, site-packages) is pickled by name, and the
  distribution it comes from is recorded in the capsule;
* a function or class of a *workspace module* found by its qualified name is pickled by
  name too, and the module's source goes into the capsule (see :mod:`sojourn.capsule.modules`):
  one definition per name, so ``isinstance`` holds, and the module is rebuilt where its file
  is gone;
* a method or nested class reached through its class travels as ``getattr(C, "name")``, so
  ``C.method is f`` still holds;
* everything else (``__main__``, lambdas, closures, decorated wrappers, redefined names,
  classes defined in a function) is rebuilt from its own source (:mod:`sojourn.capsule.source`)
  with its closure cells, defaults, attributes and globals. A class is rebuilt by running its
  class statement again (decorators and metaclass included), then setting the attributes
  that changed after it was made.

Globals: a function whose globals are the namespace being captured gets the namespace being
restored; one from a module gets that module's; otherwise (``capture({"f": f})``) it gets a
dict shared by the functions that had the same globals, holding just the names they use.
"""

from __future__ import annotations

import enum
import functools
import importlib
import linecache
import sys
import types
import weakref
from typing import Any

from sojourn.capsule.modules import ensure_user_module, source_record
from sojourn.capsule.reducers.code_enclosing import (
    SUBMODULES,
    base_bindings,
    class_cells,
    enclosing_values,
    held_by_class,
    imported_submodules,
    wraps_sourceless,
)
from sojourn.capsule.reducers.code_library import (
    REGISTERED,
    abc_registered,
    class_without_source,
    library_class,
    public_home,
    register_virtual,
)
from sojourn.capsule.registry import register
from sojourn.capsule.source import (
    OUTER,
    SOURCES,
    TEXTS,
    Source,
    SourceError,
    class_functions,
    compile_source,
    definition_names,
    find_class_source,
    function_source,
    global_names,
    is_library_file,
    is_library_module,
    lookup,
    mangling_class,
    unwrap,
)

NAMESPACE = "sojourn:namespace"  # stands for "the namespace being restored" in a capsule

# A rebuilt class -> (its source, the globals it was built in, the enclosing values it got).
_CLASSES: weakref.WeakKeyDictionary[type, tuple[Source, dict[str, Any], tuple[Any, ...]]] = weakref.WeakKeyDictionary()
_CLASS_SOURCES: weakref.WeakKeyDictionary[type, Source | str] = weakref.WeakKeyDictionary()
# A rebuilt class -> the names its statement was given (decorators, bases): they were put in
# its globals only while it ran, so capturing it again must take them from here.
_BINDINGS: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()
# A member of a rebuilt class -> (class, attribute): methods and nested classes.
_OWNERS: weakref.WeakKeyDictionary[Any, tuple[type, str]] = weakref.WeakKeyDictionary()


# -- workspace modules ---------------------------------------------------------------------------


def _module_source_record(pickler: Any, name: str) -> None:
    """Remember a workspace module's source (and hash) in the capsule."""
    ctx = pickler.ctx
    if name not in ctx.user_modules:
        rec = source_record(name, ctx.workspace)
        if rec is not None:
            ctx.user_modules[name] = rec


def reduce_workspace_module(name: str, pickler: Any) -> Any:
    """A workspace module travels as "that module, or rebuilt from this source"."""
    if is_library_module(name):
        return None
    _module_source_record(pickler, name)
    return (ensure_user_module, (name,))


def _user_global(module: str, qualname: str) -> Any:
    obj: Any = ensure_user_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _module_globals(module: str, user: bool) -> dict[str, Any]:
    if user:
        return ensure_user_module(module).__dict__
    return importlib.import_module(module).__dict__


# -- classes -------------------------------------------------------------------------------------


def class_source(cls: type) -> Source | str:
    known = _CLASSES.get(cls)
    if known is not None:
        return known[0]
    cached = _CLASS_SOURCES.get(cls)
    if cached is not None:
        return cached
    try:
        result: Source | str = find_class_source(cls)
    except SourceError as e:
        result = str(e)
    _CLASS_SOURCES[cls] = result
    return result


# -- reconstructors ------------------------------------------------------------------------------


def _resolve_globals(ref: Any) -> dict[str, Any]:
    if isinstance(ref, str) and ref == NAMESPACE:
        from sojourn.capsule.context import current

        return current().namespace
    if isinstance(ref, tuple):  # (_module_globals, (name, user)): a module's own globals
        return ref[0](*ref[1])  # type: ignore[no-any-return]
    return ref  # type: ignore[no-any-return]


def _make_function(src: Source, globals_ref: Any, closure: tuple[Any, ...] | None) -> types.FunctionType:
    code = compile_source(src).target
    if code.co_freevars != src.freevars:
        raise ValueError(f"{src.qualname} compiled again has free variables {code.co_freevars}, "
                         f"not {src.freevars}")
    return types.FunctionType(code, _resolve_globals(globals_ref), code.co_name, None, closure)


def _function_setstate(func: types.FunctionType, state: dict[str, Any]) -> None:
    extra_globals = state.pop("__globals_subset__", None)
    if extra_globals:
        func.__globals__.update(extra_globals)
    state.pop(SUBMODULES, None)  # imported as they were unpickled: nothing to set
    for k, v in state.items():
        setattr(func, k, v)


# Classes built by each restore, by their capture-time token: a class whose arguments lead
# back to itself (a base class whose state lists its subclasses) appears twice in the stream;
# its statement must run once, or decorators and __init_subclass__ would run twice.
_BUILT: dict[int, dict[int, type]] = {}  # id(RestoreContext) -> token -> class
# Class attributes each restore has set so far: a class statement that runs later (its
# metaclass, decorators or __init_subclass__) must not change them, e.g. append to a
# registry the capsule already holds. They are shadowed by copies while it runs.
_RESTORED_ATTRS: dict[int, list[tuple[type, dict[str, Any]]]] = {}


def _per_restore(ctx: Any) -> tuple[dict[int, type], list[tuple[type, dict[str, Any]]]]:
    if ctx is None:
        return {}, []
    if id(ctx) not in _BUILT:
        weakref.finalize(ctx, _BUILT.pop, id(ctx), None)
        weakref.finalize(ctx, _RESTORED_ATTRS.pop, id(ctx), None)
    return _BUILT.setdefault(id(ctx), {}), _RESTORED_ATTRS.setdefault(id(ctx), [])


def _shadow(value: Any) -> Any:
    return type(value)(value) if type(value) in (list, dict, set) else value


def _make_class(src: Source, globals_ref: Any, bindings: dict[str, Any], module: str,
                enclosing: tuple[Any, ...], token: int) -> type:
    from sojourn.capsule.context import current_or_none

    built, restored = _per_restore(current_or_none())
    if token in built:
        return built[token]
    glb = _resolve_globals(globals_ref)
    compiled = compile_source(src)
    mangle = mangling_class(src.qualname)
    # The class statement reads its names when it runs; give it the values it had at capture
    # (globals of the namespace being restored may not be loaded yet), then put globals back.
    temp = {"__name__": module, **bindings}
    saved = {k: glb[k] for k in temp if k in glb}
    scratch: dict[str, Any] = dict(temp)
    glb.update(temp)
    shadowed = [(c, k, v) for c, attrs in restored for k, v in attrs.items()]
    for c, k, v in shadowed:
        _set_class_attr(c, k, _shadow(v))
    try:
        exec(compiled.module, glb, scratch)
        made: Any = scratch[mangle] if mangle else scratch
        holder = made.__dict__ if isinstance(made, type) else made
        if "<locals>" in src.qualname:
            cls = holder[OUTER](*enclosing)
        else:
            cls = holder[src.name]
    finally:
        for c, k, v in shadowed:
            _set_class_attr(c, k, v)
        for k in temp:
            if k in saved:
                glb[k] = saved[k]
            else:
                glb.pop(k, None)
    try:
        cls.__module__ = module
    except (TypeError, AttributeError):
        pass
    _CLASSES[cls] = (src, glb, enclosing)
    # Interned, as the names of code objects are at capture: a binding's key is then the very
    # string pickle writes for the bound global's own name, as it was at capture.
    _BINDINGS[cls] = {sys.intern(k): v for k, v in bindings.items()}
    _register_members(cls)
    built[token] = cls
    return cls  # type: ignore[no-any-return]


def _register_members(cls: type) -> None:
    for k, v in vars(cls).items():
        if isinstance(v, types.FunctionType) or (isinstance(v, staticmethod) and isinstance(v.__func__, types.FunctionType)):
            _OWNERS[v.__func__ if isinstance(v, staticmethod) else v] = (cls, k)
        elif isinstance(v, type) and v.__qualname__ == f"{cls.__qualname__}.{k}":
            _OWNERS[v] = (cls, k)
            _register_members(v)


def _class_setstate(cls: type, state: tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]) -> None:
    from sojourn.capsule.context import current_or_none

    attrs, subset, cells = state
    attrs = register_virtual(cls, attrs)
    if subset:
        _CLASSES[cls][1].update(subset)
    for k, v in attrs.items():
        _set_class_attr(cls, k, v)
    if attrs:
        _per_restore(current_or_none())[1].append((cls, attrs))
    if cells:
        _rebind_closures(cls, cells)


def _set_class_attr(cls: type, name: str, value: Any) -> None:
    try:
        setattr(cls, name, value)
    except (AttributeError, TypeError):
        pass  # read-only on this class (an Enum member, a slot of a builtin type)


def _rebind_closures(cls: type, cells: dict[str, Any]) -> None:
    """Give a rebuilt local class's methods the captured cells, shared as they were."""

    def rebound(f: Any) -> Any:
        if not isinstance(f, types.FunctionType) or not f.__closure__ or f.__code__ not in TEXTS:
            return f
        closure = tuple(cells.get(n, c) for n, c in zip(f.__code__.co_freevars, f.__closure__, strict=True))
        g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, closure)
        for attr in ("__kwdefaults__", "__annotations__", "__dict__", "__doc__", "__module__", "__qualname__"):
            setattr(g, attr, getattr(f, attr))
        return g

    for k, v in list(vars(cls).items()):
        parts = unwrap(v)
        fresh = [rebound(f) for f in parts]
        if all(a is b for a, b in zip(parts, fresh, strict=True)):
            continue
        if isinstance(v, staticmethod | classmethod):
            setattr(cls, k, type(v)(fresh[0]))
        elif isinstance(v, property):
            setattr(cls, k, property(fresh[0], fresh[1], fresh[2], v.__doc__))
        else:
            setattr(cls, k, fresh[0])
    _register_members(cls)


def _make_cell() -> types.CellType:
    return types.CellType()


def _cell_setstate(cell: types.CellType, state: tuple[Any, ...]) -> None:
    if state:
        cell.cell_contents = state[0]


# -- reducers ------------------------------------------------------------------------------------


@register("builtins.cell")
def _cell_reduce(cell: types.CellType, pickler: Any) -> Any:
    try:
        state: tuple[Any, ...] = (cell.cell_contents,)
    except ValueError:
        state = ()
    return (_make_cell, (), state, None, None, _cell_setstate)


def _globals_ref(func_globals: dict[str, Any], pickler: Any) -> tuple[Any, bool]:
    """How a function's globals travel; the flag says whether only a subset does."""
    if pickler.ctx.namespace is not None and func_globals is pickler.ctx.namespace:
        return NAMESPACE, False
    name = func_globals.get("__name__")
    if isinstance(name, str) and name != "__main__":
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__dict__", None) is func_globals:
            user = not is_library_module(name)
            if user:
                _module_source_record(pickler, name)
            else:
                pickler.note_module(name)
            return (_module_globals, (name, user)), False
    # A namespace we cannot name (``__main__`` when capturing a dict that is not its globals):
    # one shared dict per original, filled with what each function uses (like cloudpickle).
    shared = pickler._shared_globals.setdefault(id(func_globals), {"__name__": name if isinstance(name, str) else "__main__"})
    pickler.keepalive(func_globals)
    return shared, True


def reduce_function(func: types.FunctionType, pickler: Any) -> Any:
    module = func.__module__ if isinstance(func.__module__, str) else None
    qualname = func.__qualname__
    if module not in (None, "__main__") and lookup(module, qualname) is func:  # type: ignore[arg-type]
        if is_library_module(module):
            pickler.note_module(module)
            return NotImplemented
        _module_source_record(pickler, module)  # type: ignore[arg-type]
        return (_user_global, (module, qualname))
    owner = _owner_of(func, pickler)
    if owner is not None:
        return (getattr, owner)
    library = module not in (None, "__main__") and is_library_module(module)
    if library:
        pickler.note_module(module)  # a library's closure or lambda: rebuilt from its source
    src = function_source(func)
    if isinstance(src, str) or (is_library_file(func.__code__.co_filename) and wraps_sourceless(func)):
        # A method a decorator or a metaclass generated from a string, or wrapped in a
        # library's closure (a dataclass's __init__, __repr__), of a class defined in a
        # function: the class makes it again, so it travels as the class's attribute.
        held = held_by_class(func, pickler)
        if held is not None:
            return (getattr, held)
    if isinstance(src, str):
        return pickler.problem(func, src)
    globals_ref, subset = _globals_ref(func.__globals__, pickler)
    state: dict[str, Any] = {}
    if subset:
        glb = func.__globals__
        state["__globals_subset__"] = {n: glb[n] for n in sorted(global_names(func.__code__)) if n in glb}
    if func.__name__ != src.name:
        state["__name__"] = func.__name__
    if func.__qualname__ != src.qualname:
        state["__qualname__"] = func.__qualname__
    state["__module__"] = func.__module__
    state["__doc__"] = func.__doc__
    if func.__defaults__ is not None:
        state["__defaults__"] = func.__defaults__
    if func.__kwdefaults__:
        state["__kwdefaults__"] = func.__kwdefaults__
    if func.__annotations__:
        state["__annotations__"] = func.__annotations__
    if func.__dict__:
        state["__dict__"] = func.__dict__
    submodules = imported_submodules(func)
    if submodules:
        state[SUBMODULES] = submodules
    return (_make_function, (src, globals_ref, func.__closure__), state, None, None, _function_setstate)


def _attr_is(owner: type, name: str, obj: Any) -> bool:
    v = owner.__dict__.get(name)
    return v is obj or (isinstance(v, staticmethod) and v.__func__ is obj)


def _owner_of(obj: Any, pickler: Any) -> tuple[type, str] | None:
    """(class, attribute) through which ``obj`` (a method or nested class) is reached."""
    # A class that travels by value (code_library) carries its members itself: reaching them
    # through the class would ask the class for what it is being built from.
    by_value = pickler.__dict__.get("_sojourn_by_value", ())
    hit = _OWNERS.get(obj)
    if hit is not None and _attr_is(*hit, obj) and id(hit[0]) not in by_value:
        return hit
    parts = obj.__qualname__.split(".")
    if len(parts) < 2 or "<locals>" in parts:
        return None
    owner = _find_owner(obj.__module__, parts[:-1], pickler)
    if not isinstance(owner, type) or id(owner) in by_value:
        return None
    if _attr_is(owner, parts[-1], obj):
        return (owner, parts[-1])
    for k in vars(owner):
        if _attr_is(owner, k, obj):  # a lambda or function stored under another name
            return (owner, k)
    return None


def _find_owner(module: str | None, parts: list[str], pickler: Any) -> Any:
    if module and module != "__main__":
        return lookup(module, ".".join(parts))
    main = sys.modules.get("__main__")
    for root in (pickler.ctx.namespace, getattr(main, "__dict__", None)):
        obj: Any = root.get(parts[0]) if isinstance(root, dict) else None
        for p in parts[1:]:
            obj = getattr(obj, p, None)
        if isinstance(obj, type):
            return obj
    return None


def _class_globals(cls: type, src: Source, pickler: Any) -> dict[str, Any]:
    """The globals the class statement ran in: those of its own methods (compiled from its
    source: a library decorator's wrapper has the library's), else its module's."""
    known = _CLASSES.get(cls)
    if known is not None:
        return known[1]
    for f in class_functions(cls):
        if f.__code__.co_filename == src.filename and f.__qualname__.startswith(cls.__qualname__ + "."):
            return f.__globals__  # a script's, or a notebook's
    module = sys.modules.get(cls.__module__)
    if module is not None:
        return module.__dict__
    return pickler.ctx.namespace if pickler.ctx.namespace is not None else {}


def _from_source(cls: type, src: Source, name: str, value: Any) -> bool:
    """Whether the class statement itself (or its decorators) creates this attribute.

    What is not travels in the class's state: functions assigned after the class was made.
    The answer must not depend on the Python version (3.13's dataclasses add ``__replace__``)
    nor on which side of a restore asks.
    """
    if isinstance(value, type):
        return value.__qualname__ == f"{cls.__qualname__}.{name}"
    funcs = [f for f in unwrap(value) if isinstance(f, types.FunctionType)]
    if not funcs:
        return isinstance(value, property) or (callable(getattr(value, "__get__", None)) and not isinstance(
            value, types.ModuleType | types.BuiltinFunctionType | functools.partial))
    f = funcs[0]
    if f.__qualname__.startswith(cls.__qualname__ + "."):
        return True
    if f.__code__ in SOURCES or f.__code__ in TEXTS:
        return False  # user code rebuilt from its source elsewhere: assigned to the class
    filename = f.__code__.co_filename
    if is_library_file(filename) or not linecache.getlines(filename):
        if name.startswith("__") and name.endswith("__"):
            return True  # installed by a library's decorator or metaclass
        module = f.__module__  # a library function assigned by the user travels by name
        return not (isinstance(module, str) and lookup(module, f.__qualname__) is f)
    if filename == src.filename:
        return src.lineno <= f.__code__.co_firstlineno <= src.lineno + src.text.count("\n")
    return False


def _class_state(cls: type, src: Source) -> dict[str, Any]:
    if isinstance(cls, enum.EnumMeta):
        return {}  # members and their values come from the class statement
    state: dict[str, Any] = {}
    registered = abc_registered(cls)
    if registered:
        state[REGISTERED] = registered  # Base.register(tuple), kept in _abc_impl
    for k, v in vars(cls).items():
        if k in ("__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "_abc_impl"):
            continue
        if isinstance(v, types.MemberDescriptorType | types.GetSetDescriptorType):
            continue
        if _from_source(cls, src, k, v):
            continue
        if k == "__annotations__" and v:
            state[k] = v  # the statement's own, or set after it (C.__annotations__ = {...})
            continue
        if k.startswith("__") and k.endswith("__") and not isinstance(v, types.FunctionType | staticmethod | classmethod):
            continue  # set by the class machinery (__dataclass_fields__, __firstlineno__, ...)
        state[k] = v
    return state


def reduce_class(cls: type, pickler: Any) -> Any:
    module = cls.__module__
    qualname = cls.__qualname__
    if module != "__main__" and lookup(module, qualname) is cls:
        if is_library_module(module):
            pickler.note_module(module)
            home = public_home(module, qualname, cls)
            if home is not None:  # pathlib._local.PosixPath (3.13) is pathlib.PosixPath on 3.12
                return (getattr, (home, qualname))
            return NotImplemented
        _module_source_record(pickler, module)
        return (_user_global, (module, qualname))
    owner = _owner_of(cls, pickler)
    if owner is not None:
        return (getattr, owner)
    if module != "__main__" and is_library_module(module):
        pickler.note_module(module)
        rv = library_class(cls, pickler)
        if rv is None:
            rv = class_without_source(cls, pickler)  # a namedtuple a library made (pandas' rows)
        if rv is not None:
            return rv
        return pickler.problem(cls, f"class {qualname} of the library module {module} cannot be found "
                               f"by its name {module}.{qualname}, so it cannot be referenced on the "
                               "destination")
    src = class_source(cls)
    if isinstance(src, str):
        rv = class_without_source(cls, pickler)  # made by a call: namedtuple(), type(), ...
        return rv if rv is not None else pickler.problem(cls, src)
    known = _CLASSES.get(cls)
    enclosing = known[2] if known is not None else enclosing_values(cls, src)
    if isinstance(enclosing, str):
        return pickler.problem(cls, enclosing)
    glb = _class_globals(cls, src, pickler)
    globals_ref, subset = _globals_ref(glb, pickler)
    rebuilt = _BINDINGS.get(cls)
    bindings: dict[str, Any] = dict(rebuilt) if rebuilt is not None else {}
    bases = base_bindings(src, cls) if rebuilt is None else {}
    for name in definition_names(compile_source(src)) if rebuilt is None else ():
        if name in src.freevars or (name.startswith("__") and name.endswith("__")):
            continue  # __name__ is the class's module; __annotations__ its own; no others
        if name in bases:
            bindings[name] = bases[name]
        elif name in glb and glb[name] is not cls:
            bindings[name] = glb[name]
    used: set[str] = set()
    for f in class_functions(cls):
        used |= global_names(f.__code__)
    shared = {n: glb[n] for n in sorted(used) if n in glb} if subset else None
    cells = class_cells(cls) if src.freevars or "<locals>" in qualname else None
    state = (_class_state(cls, src), shared, cells or None)
    tokens = pickler.__dict__.setdefault("_sojourn_class_tokens", {})
    token = tokens.setdefault(id(cls), len(tokens))
    pickler.keepalive(cls)
    return (_make_class, (src, globals_ref, bindings, module, enclosing, token), state, None, None, _class_setstate)


# -- method wrappers and functools wrappers ------------------------------------------------------


@register("builtins.staticmethod")
def _staticmethod_reduce(obj: staticmethod, pickler: Any) -> Any:  # type: ignore[type-arg]
    return (staticmethod, (obj.__func__,))


@register("builtins.classmethod")
def _classmethod_reduce(obj: classmethod, pickler: Any) -> Any:  # type: ignore[type-arg]
    return (classmethod, (obj.__func__,))


@register("builtins.property")
def _property_reduce(obj: property, pickler: Any) -> Any:
    return (property, (obj.fget, obj.fset, obj.fdel, obj.__doc__))


def _make_lru(func: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(func)


@register("functools._lru_cache_wrapper")
def _lru_reduce(obj: Any, pickler: Any) -> Any:
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module != "__main__" and lookup(module, obj.__qualname__) is obj:
        if is_library_module(module):
            pickler.note_module(module)
            return NotImplemented
        _module_source_record(pickler, module)
        return (_user_global, (module, obj.__qualname__))
    params = obj.cache_parameters()
    return (_make_lru, (obj.__wrapped__, params["maxsize"], params["typed"]))  # the cache stays behind


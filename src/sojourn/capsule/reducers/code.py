"""User code travels as source; library code travels by reference.

Bytecode does not survive a change of Python minor version (a lambda pickled by
cloudpickle on 3.11 crashes 3.13), source does. So:

* a function or class from a *library* (stdlib, site-packages) is pickled by name;
* a function or class from a *workspace module* that can be found by its qualified name is
  pickled by name too, and the module's source hash goes into the capsule: on restore the
  module is imported from the restored workspace files, or rebuilt from the recorded source
  when the file is gone or changed, so there is one definition per name and ``isinstance``
  holds;
* everything else (``__main__``, lambdas, closures, redefined names, notebook cells) is
  rebuilt from its own source text: the exact segment of the file the code object came
  from, found through the file's AST, compiled again on the destination with the same file
  name and line numbers, with its closure cells, defaults and globals restored.

Methods reached through their class (``f = C.method``) travel as ``getattr(C, "method")`` so
that identity with the class's own function holds.
"""

from __future__ import annotations

import ast
import builtins
import enum
import functools
import hashlib
import importlib
import linecache
import os
import site
import sys
import sysconfig
import textwrap
import types
import weakref
from dataclasses import dataclass
from typing import Any

from sojourn.capsule.registry import register

NAMESPACE = "sojourn:namespace"  # stands for "the namespace being restored" in a capsule


@dataclass(frozen=True)
class Source:
    """Where a piece of user code came from, and its text."""

    kind: str  # "def", "lambda" or "class"
    text: str  # dedented source of the definition
    filename: str
    lineno: int  # line of the definition's first line (decorators included for classes)
    name: str
    qualname: str
    freevars: tuple[str, ...] = ()

    def __reduce__(self) -> Any:
        return (Source, (self.kind, self.text, self.filename, self.lineno, self.name, self.qualname, self.freevars))


# Sources of code rebuilt in this process, so that re-pickling it (to fingerprint a restore,
# or to capture again) does not need the original file.
_REBUILT: weakref.WeakKeyDictionary[Any, Source] = weakref.WeakKeyDictionary()
_REBUILT_CODE: dict[types.CodeType, Source] = {}


# -- library or user? --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        roots.add(os.path.realpath(path))
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    roots.add(os.path.realpath(os.path.dirname(os.path.dirname(__file__))))  # sojourn itself
    return tuple(sorted(roots))


@functools.lru_cache(maxsize=4096)
def _is_library_file(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + os.sep) for r in _library_roots())


def is_library_module(name: str | None) -> bool:
    if not name or name == "__main__":
        return False
    if name in sys.builtin_module_names:
        return True
    mod = sys.modules.get(name)
    if mod is None:
        return True  # not loaded here: whatever defined it, we cannot rebuild it anyway
    path = getattr(mod, "__file__", None)
    if not path:
        return True  # builtin, frozen or namespace package
    return _is_library_file(path)


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module)
    if obj is None:
        return None
    for part in qualname.split("."):
        if part == "<locals>":
            return None
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _module_source_record(pickler: Any, name: str) -> None:
    """Remember a workspace module's source (and hash) in the capsule."""
    ctx = pickler.ctx
    if name in ctx.user_modules:
        return
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    text = None
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = "".join(linecache.getlines(path)) or None
    if text is None:
        return
    rel = None
    if ctx.workspace is not None and path:
        try:
            rel = os.path.relpath(os.path.realpath(path), os.path.realpath(ctx.workspace))
            if rel.startswith(".."):
                rel = None
        except ValueError:
            rel = None
    ctx.user_modules[name] = {
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "path": rel,
        "source": text,
        "is_package": bool(getattr(mod, "__path__", None)),
    }


def _user_global(module: str, qualname: str) -> Any:
    from sojourn.capsule.modules import ensure_user_module

    obj: Any = ensure_user_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _module_globals(module: str, user: bool) -> dict[str, Any]:
    if user:
        from sojourn.capsule.modules import ensure_user_module

        return ensure_user_module(module).__dict__
    return importlib.import_module(module).__dict__


# -- finding source ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _parse(filename: str, text: str) -> ast.Module:
    return ast.parse(text, filename)


def _file_text(filename: str, module: Any = None) -> str | None:
    lines = linecache.getlines(filename, module.__dict__ if isinstance(module, types.ModuleType) else None)
    if not lines:
        return None
    return "".join(lines)


def _segment(text: str, start_line: int, node: ast.AST) -> str:
    lines = text.splitlines(keepends=True)
    end = node.end_lineno or start_line  # type: ignore[attr-defined]
    seg = lines[start_line - 1 : end]
    if seg:
        # Cut anything after the node on its last line ("f = lambda: 1; g()").
        last_col = node.end_col_offset  # type: ignore[attr-defined]
        if last_col is not None:
            seg[-1] = seg[-1].encode()[:last_col].decode(errors="ignore") + "\n"
    return textwrap.dedent("".join(seg))


def _code_positions(code: types.CodeType) -> list[tuple[int, int]]:
    out = []
    for pos in code.co_positions():
        if pos[0] is not None and pos[2] is not None:
            out.append((pos[0], pos[2]))
    return out


def function_source(func: types.FunctionType) -> Source | None:
    code = func.__code__
    known = _REBUILT_CODE.get(code)
    if known is not None:
        return known
    filename = code.co_filename
    text = _file_text(filename, sys.modules.get(func.__module__))
    if text is None:
        return None
    try:
        tree = _parse(filename, text)
    except SyntaxError:
        return None
    is_lambda = code.co_name == "<lambda>"
    candidates: list[ast.AST] = []
    for node in ast.walk(tree):
        if is_lambda and isinstance(node, ast.Lambda):
            if node.lineno <= code.co_firstlineno <= (node.end_lineno or node.lineno):
                candidates.append(node)
        elif not is_lambda and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.name == code.co_name and code.co_firstlineno in (first, node.lineno):
                candidates.append(node)
    if len(candidates) > 1:
        # Several lambdas on one line: keep the one whose span holds the code's positions.
        positions = _code_positions(code)
        candidates = [
            n for n in candidates
            if all(
                (n.lineno, n.col_offset) <= p <= (n.end_lineno or n.lineno, n.end_col_offset or 1 << 30)  # type: ignore[attr-defined,operator]
                for p in positions
            )
        ]
        candidates.sort(key=lambda n: (n.end_lineno or 0) - n.lineno)  # type: ignore[attr-defined]
    if not candidates:
        return None
    node = candidates[0]
    src = _lambda_text(text, node) if is_lambda else _segment(text, node.lineno, node)  # type: ignore[attr-defined]
    return Source(
        "lambda" if is_lambda else "def",
        src,
        filename,
        node.lineno,  # type: ignore[attr-defined]
        func.__name__,
        func.__qualname__,
        code.co_freevars,
    )


def _lambda_text(text: str, node: ast.AST) -> str:
    seg = ast.get_source_segment(text, node) or ""
    # Keep multi-line lambdas compilable as one expression.
    return "(" + seg + ")"


def class_source(cls: type) -> Source | None:
    known = _REBUILT.get(cls)
    if known is not None:
        return known
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    if filename is None:
        # Notebooks and exec'd code: look for the first method's file instead.
        for value in vars(cls).values():
            f = getattr(value, "__func__", value)
            if isinstance(f, types.FunctionType):
                filename = f.__code__.co_filename
                break
    if filename is None:
        return None
    text = _file_text(filename, module)
    if text is None:
        return None
    try:
        tree = _parse(filename, text)
    except SyntaxError:
        return None
    firstline = getattr(cls, "__firstlineno__", None)
    candidates = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if firstline is None or firstline in (first, node.lineno):
                candidates.append((node, first))
    if firstline is None and len(candidates) > 1:
        candidates = [c for c in candidates if _class_matches(cls, c[0])] or candidates
        # Redefinitions: the last definition in the file is the live one for top level.
        candidates = candidates[-1:]
    if not candidates:
        return None
    node, first = candidates[0]
    return Source("class", _segment(text, first, node), filename, first, cls.__name__, cls.__qualname__)


def _class_matches(cls: type, node: ast.ClassDef) -> bool:
    names = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    own = {k for k, v in vars(cls).items() if isinstance(v, types.FunctionType)}
    return own <= names


# -- compiling source again ----------------------------------------------------------------------


def _compile_definition(src: Source, params: tuple[str, ...]) -> types.CodeType:
    """Compile ``src`` inside a function whose parameters are its free variables.

    The padding puts every line back at its original number, so tracebacks point into the
    user's file.
    """
    body = textwrap.indent(src.text, "    ")
    if src.kind == "lambda":
        body = f"    return {src.text.strip()}\n"
    else:
        body += f"    return {src.name}\n"
    header = f"def __sojourn_outer__({', '.join(params)}):\n"
    pad = "\n" * max(0, src.lineno - 2)
    return compile(pad + header + body, src.filename, "exec", dont_inherit=True)


def _inner_code(outer_module_code: types.CodeType, src: Source) -> types.CodeType:
    outer = next(c for c in outer_module_code.co_consts if isinstance(c, types.CodeType))
    want = "<lambda>" if src.kind == "lambda" else src.name
    for c in outer.co_consts:
        if isinstance(c, types.CodeType) and c.co_name == want:
            return c
    raise ValueError(f"cannot find the code of {src.qualname} in its recompiled source")


def _resolve_globals(ref: Any) -> dict[str, Any]:
    if ref == NAMESPACE:
        from sojourn.capsule.context import current

        return current().namespace
    return ref  # type: ignore[no-any-return]


def _make_function(src: Source, globals_ref: Any, closure: tuple[Any, ...] | None) -> types.FunctionType:
    glb = _resolve_globals(globals_ref)
    code = _inner_code(_compile_definition(src, src.freevars), src)
    if code.co_freevars != src.freevars:
        by_name = dict(zip(src.freevars, closure or (), strict=False))
        closure = tuple(by_name.get(n, types.CellType()) for n in code.co_freevars)
    func = types.FunctionType(code, glb, src.name, None, closure or None)
    func.__qualname__ = src.qualname
    _REBUILT[func] = src
    _REBUILT_CODE[code] = src
    return func


def _function_setstate(func: types.FunctionType, state: dict[str, Any]) -> None:
    extra_globals = state.pop("__globals_subset__", None)
    if extra_globals:
        func.__globals__.update(extra_globals)
    for k, v in state.items():
        setattr(func, k, v)


def _make_class(src: Source, globals_ref: Any, definition_globals: dict[str, Any], module: str) -> type:
    glb = _resolve_globals(globals_ref)
    for k, v in definition_globals.items():
        glb.setdefault(k, v)
    outer_code = _compile_definition(src, ())
    outer_fn_code = next(c for c in outer_code.co_consts if isinstance(c, types.CodeType))
    outer = types.FunctionType(outer_fn_code, glb)
    cls = outer()
    try:
        cls.__qualname__ = src.qualname
        cls.__module__ = module
    except (TypeError, AttributeError):
        pass
    _REBUILT[cls] = src
    for value in vars(cls).values():
        f = getattr(value, "__func__", value)
        f = getattr(f, "fget", f)
        if isinstance(f, types.FunctionType):
            _REBUILT_CODE.setdefault(f.__code__, src)
    return cls  # type: ignore[no-any-return]


def _class_setstate(cls: type, state: dict[str, Any]) -> None:
    for k, v in state.items():
        try:
            setattr(cls, k, v)
        except (AttributeError, TypeError):
            pass


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
    shared = pickler._shared_globals.setdefault(id(func_globals), {"__name__": name or "__main__"})
    pickler.keepalive(func_globals)
    return shared, True


def _referenced_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _referenced_names(c)
    return names


def reduce_function(func: types.FunctionType, pickler: Any) -> Any:
    module = func.__module__
    qualname = func.__qualname__
    if module != "__main__" and _lookup(module, qualname) is func:
        if is_library_module(module):
            pickler.note_module(module)
            return NotImplemented
        _module_source_record(pickler, module)
        return (_user_global, (module, qualname))
    parts = qualname.split(".")
    if "<locals>" not in parts and len(parts) > 1:
        owner = _lookup(module, ".".join(parts[:-1])) if module != "__main__" else None
        if owner is None and module == "__main__":
            owner = _main_owner(func, pickler)
        if isinstance(owner, type) and owner.__dict__.get(parts[-1]) is func:
            return (getattr, (owner, parts[-1]))
    if is_library_module(module) and module not in ("__main__",):
        # A library closure or lambda: rebuilt from the library's source if we can read it.
        pickler.note_module(module)
    src = function_source(func)
    if src is None:
        return pickler.problem(
            func,
            f"the source of {qualname} cannot be found (defined by exec or its file is gone); "
            "define it in a file of the workspace",
        )
    globals_ref, subset = _globals_ref(func.__globals__, pickler)
    state: dict[str, Any] = {}
    if func.__defaults__ is not None:
        state["__defaults__"] = func.__defaults__
    if func.__kwdefaults__:
        state["__kwdefaults__"] = func.__kwdefaults__
    if func.__dict__:
        state["__dict__"] = func.__dict__
    if func.__doc__ is not None and func.__doc__ != _doc_of(src):
        state["__doc__"] = func.__doc__
    if func.__annotations__:
        state["__annotations__"] = func.__annotations__
    if func.__module__ is not None:
        state["__module__"] = func.__module__
    if subset:
        glb = func.__globals__
        state["__globals_subset__"] = {
            n: glb[n] for n in sorted(_referenced_names(func.__code__)) if n in glb
        }
    return (_make_function, (src, globals_ref, func.__closure__), state, None, None, _function_setstate)


def _doc_of(src: Source) -> None:
    return None


def _main_owner(func: types.FunctionType, pickler: Any) -> Any:
    ns = pickler.ctx.namespace
    main = sys.modules.get("__main__")
    parts = func.__qualname__.split(".")[:-1]
    for root in (ns, getattr(main, "__dict__", None)):
        if not root:
            continue
        obj: Any = root.get(parts[0])
        for p in parts[1:]:
            obj = getattr(obj, p, None)
        if isinstance(obj, type):
            return obj
    return None


_SKIP_CLASS_ATTRS = {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "__firstlineno__", "__static_attributes__"}


def _class_state(cls: type) -> dict[str, Any]:
    if isinstance(cls, enum.EnumMeta):
        return {}
    state = {}
    for k, v in vars(cls).items():
        if k in _SKIP_CLASS_ATTRS or (k.startswith("__") and k.endswith("__")):
            continue
        if isinstance(v, types.FunctionType | staticmethod | classmethod | property | type | types.MemberDescriptorType | types.GetSetDescriptorType | functools.cached_property):
            continue
        if callable(getattr(v, "__get__", None)) and not isinstance(v, types.ModuleType):
            continue  # other descriptors come from the source
        state[k] = v
    return state


def _definition_globals(src: Source, glb: dict[str, Any]) -> dict[str, Any]:
    """Globals the class statement needs while it runs (bases, decorators, class-body names)."""
    try:
        code = compile(src.text, src.filename, "exec", dont_inherit=True)
    except SyntaxError:
        return {}
    names = set(code.co_names)
    for c in code.co_consts:  # the class body, but not its methods' bodies
        if isinstance(c, types.CodeType):
            names |= set(c.co_names)
    return {n: glb[n] for n in sorted(names) if n in glb and not hasattr(builtins, n) and n != src.name}


def reduce_class(cls: type, pickler: Any) -> Any:
    module = cls.__module__
    qualname = cls.__qualname__
    if module != "__main__" and _lookup(module, qualname) is cls:
        if is_library_module(module):
            pickler.note_module(module)
            return NotImplemented
        _module_source_record(pickler, module)
        return (_user_global, (module, qualname))
    if is_library_module(module) and module != "__main__":
        return NotImplemented  # let pickle try (and fail with its own message) by name
    src = class_source(cls)
    if src is None:
        return pickler.problem(cls, f"the source of class {qualname} cannot be found")
    if "<locals>" in qualname.split("."):
        return pickler.problem(
            cls, f"class {qualname} is defined inside a function; define it at module level"
        )
    main_dict = getattr(sys.modules.get(module), "__dict__", None)
    glb = main_dict if isinstance(main_dict, dict) else (pickler.ctx.namespace or {})
    if pickler.ctx.namespace is not None and (
        glb is pickler.ctx.namespace or module == "__main__"
    ):
        globals_ref: Any = NAMESPACE if _defined_in(cls, pickler.ctx.namespace) else _globals_ref(glb, pickler)[0]
    else:
        globals_ref = _globals_ref(glb, pickler)[0]
    defn = _definition_globals(src, glb)
    return (_make_class, (src, globals_ref, defn, module), _class_state(cls), None, None, _class_setstate)


def _defined_in(cls: type, ns: dict[str, Any]) -> bool:
    for value in vars(cls).values():
        f = getattr(value, "__func__", value)
        if isinstance(f, types.FunctionType):
            return f.__globals__ is ns
    return True


# -- functools wrappers whose own pickling is by name only ---------------------------------------


def _make_lru(func: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(func)


@register("functools._lru_cache_wrapper")
def _lru_reduce(obj: Any, pickler: Any) -> Any:
    wrapped = obj.__wrapped__
    if wrapped.__module__ != "__main__" and is_library_module(wrapped.__module__):
        return NotImplemented
    params = obj.cache_parameters()
    return (_make_lru, (wrapped, params["maxsize"], params["typed"]))

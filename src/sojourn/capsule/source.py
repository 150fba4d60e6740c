"""The source of user code: found, checked against the running code, and compiled again.

A function or class that travels as source is recorded as a :class:`Source`: the lines of
its definition exactly as they are in the file (never re-indented: that would change
multi-line strings), its file name, first line, qualified name, free variables and the
``__future__`` features in effect. To compile it again, the definition is wrapped in the
smallest scaffold that gives it the scopes it had:

* a function ``__sojourn_outer__(free, variables)`` when it closes over variables (or is a
  class defined in a function), so they compile as free variables, not globals;
* a ``class C:`` header when it was defined inside class ``C``, so private names are mangled
  as they were (``self.__x`` is ``self._C__x``);
* blank lines in front, so every line keeps its number (tracebacks point into the user's file).

The compiled code's qualified names are then rewritten to the original ones. At capture the
scaffold is compiled once and compared with the running code (instructions, names,
constants), so a file edited after it was loaded is refused instead of silently rebuilding
something else. Code compiled here keeps the text it came from (:data:`TEXTS`), so functions
created later by rebuilt code (a closure made after a restore) have a source too.
"""

from __future__ import annotations
import __future__

import ast
import dis
import functools
import inspect
import linecache
import os
import site
import symtable
import sys
import sysconfig
import types
import weakref
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sojourn.capsule.modules import rebuilt_module_source

V = TypeVar("V")
OUTER = "__sojourn_outer__"  # the scaffold function; dunder, so never name-mangled


@dataclass(frozen=True)
class Source:
    """A definition's source and what it takes to compile it again."""

    kind: str  # "def", "lambda" or "class"
    text: str  # the lines as in the file (decorators included for classes); a lambda's expression
    filename: str
    lineno: int  # line of the text's first line
    name: str  # the name the compiler gives it: the def or class name, or "<lambda>"
    qualname: str  # the compiler's qualified name (co_qualname, or the class's)
    freevars: tuple[str, ...] = ()  # def/lambda: co_freevars; class: enclosing names it needs
    futures: tuple[str, ...] = ()  # __future__ features in effect where it was defined

    def __reduce__(self) -> Any:
        return (Source, (self.kind, self.text, self.filename, self.lineno, self.name,
                         self.qualname, self.freevars, self.futures))


@dataclass
class Compiled:
    module: types.CodeType  # the whole scaffold
    target: types.CodeType  # the definition's code (a class: its body)
    text: str  # what was compiled


class _ByCode(Generic[V]):
    """A weak mapping keyed by code objects' identity: equal code objects (a method and its
    recompiled twin) are different keys here."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ref[types.CodeType], V]] = {}

    def get(self, code: types.CodeType) -> V | None:
        hit = self._items.get(id(code))
        return hit[1] if hit is not None and hit[0]() is code else None

    def __contains__(self, code: types.CodeType) -> bool:
        return self.get(code) is not None

    def __setitem__(self, code: types.CodeType, value: V) -> None:
        key = id(code)
        self._items[key] = (weakref.ref(code, lambda _, key=key: self._items.pop(key, None)), value)  # type: ignore[misc]


# Registries that make re-pickling rebuilt code a fixpoint without the original files.
SOURCES: _ByCode[Source] = _ByCode()
_NO_SOURCE: _ByCode[str] = _ByCode()
TEXTS: _ByCode[tuple[str, tuple[str, ...]]] = _ByCode()
_COMPILED: dict[Source, Compiled] = {}
_FUTURES = ("annotations", "barry_as_FLUFL")  # the only features that still change code
_COMPREHENSIONS = {"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"}
# Files of interactive code (notebook cells), oldest first, kept by the front end that runs
# them (sojourn.notebook). A class of __main__ whose methods were all made by a decorator
# from a string (a dataclass) names no file of its own; its cell is found among these.
INTERACTIVE_FILES: list[str] = []


class SourceError(Exception):
    """The source of a definition cannot be found, or does not match the running code."""


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
    roots.add(os.path.realpath(os.path.join(os.path.dirname(__file__), "..")))  # sojourn itself
    return tuple(sorted(roots))


@functools.lru_cache(maxsize=4096)
def is_library_file(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + os.sep) for r in _library_roots()) or _installed_on_path(real)


def _installed_on_path(real: str) -> bool:
    """A file of a distribution installed into a directory on ``sys.path`` outside the site
    directories (``pip install --target``, a cluster's shared software on PYTHONPATH): the
    directory holds the distribution's ``.dist-info``. Such a library must be pickled by
    reference on one machine as on another where it sits in site-packages, or the restore's
    fingerprint check refuses its objects. (``.egg-info`` is not asked: an in-tree setuptools
    checkout has one, and its modules are the program's.)"""
    for entry in sys.path:
        if not entry:
            continue
        base = os.path.realpath(entry)
        if real.startswith(base + os.sep):
            top = real[len(base) + 1:].split(os.sep, 1)[0].split(".", 1)[0]
            if top in _tops_with_dist_info(base):
                return True
    return False


@functools.lru_cache(maxsize=256)
def _tops_with_dist_info(base: str) -> frozenset[str]:
    tops: set[str] = set()
    try:
        infos = [n for n in os.listdir(base) if n.endswith(".dist-info")]
    except OSError:
        return frozenset()
    for info in infos:
        try:
            with open(os.path.join(base, info, "top_level.txt")) as f:
                tops.update(line.strip() for line in f if line.strip())
            continue
        except OSError:
            pass
        try:  # no top_level.txt (most wheels built without setuptools): the files it installed
            with open(os.path.join(base, info, "RECORD")) as f:
                for line in f:
                    first = line.split(",", 1)[0].split("/", 1)[0]
                    if first and not first.endswith((".dist-info", ".data")) and first != "..":
                        tops.add(first.split(".", 1)[0])
        except OSError:
            pass
    return frozenset(tops)


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
        return rebuilt_module_source(name) is None  # builtin, frozen or namespace package
    return is_library_file(path)


def lookup(module: str, qualname: str) -> Any:
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


# -- finding source ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _parse(filename: str, text: str) -> ast.Module:
    return ast.parse(text, filename)


def _futures_of(tree: ast.Module) -> tuple[str, ...]:
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            found |= {a.name for a in node.names}
    return tuple(f for f in _FUTURES if f in found)


def _futures_of_flags(flags: int) -> tuple[str, ...]:
    return tuple(f for f in _FUTURES if flags & getattr(__future__, f).compiler_flag)


def _file_text(filename: str, module_globals: dict[str, Any] | None) -> str | None:
    lines = linecache.getlines(filename, module_globals)
    return "".join(lines) if lines else None


def _lines(text: str, node: ast.AST, first: int) -> str:
    """Lines ``first`` to the node's end, as in the file, cut after the node's last column."""
    lines = text.splitlines(keepends=True)
    end = node.end_lineno or first  # type: ignore[attr-defined]
    seg = lines[first - 1 : end]
    if seg and node.end_col_offset is not None:  # type: ignore[attr-defined]
        seg[-1] = seg[-1].encode()[: node.end_col_offset].decode(errors="ignore")  # type: ignore[attr-defined]
    return "".join(seg).rstrip("\n") + "\n"


def _no_source(what: str, filename: str, lineno: int) -> str:
    if filename.startswith("<") and filename.endswith(">"):
        return (f"{what} was created by exec() or compile() from a string ({filename} line {lineno}), "
                "so there is no source to rebuild it from on the destination; define it in a file "
                "of the workspace")
    return (f"the source of {what} cannot be read from {filename} (line {lineno}); its file is "
            "gone or unreadable. Keep the file, or define it in a file of the workspace")


def function_source(func: types.FunctionType) -> Source | str:
    """The source of ``func``'s code, checked against the code itself; or why there is none."""
    code = func.__code__
    known = SOURCES.get(code)
    if known is not None:
        return known
    reason = _NO_SOURCE.get(code)
    if reason is not None:
        return reason
    try:
        src = _find_function_source(code, func.__globals__)
    except SourceError as e:
        _NO_SOURCE[code] = str(e)
        return str(e)
    SOURCES[code] = src
    return src


def _find_function_source(code: types.CodeType, glb: dict[str, Any]) -> Source:
    what = f"function {code.co_qualname}"
    rebuilt = TEXTS.get(code)
    if rebuilt is not None:
        text, futures = rebuilt
    else:
        found = _file_text(code.co_filename, glb)
        if found is None:
            raise SourceError(_no_source(what, code.co_filename, code.co_firstlineno))
        text, futures = found, _futures_of_flags(code.co_flags)
    try:
        tree = _parse(code.co_filename, text)
    except SyntaxError:
        raise SourceError(f"{code.co_filename} does not parse any more, so {what} cannot be rebuilt from it") from None
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
    positions = {(p[0], p[2]) for p in code.co_positions() if p[0] is not None and p[2] is not None}
    # Several lambdas on one line: try first the one whose span holds the code's positions.
    candidates.sort(key=lambda n: -sum(_within(n, p) for p in positions))
    for node in candidates:
        if is_lambda:
            body = ast.get_source_segment(text, node) or ""
        else:
            body = _lines(text, node, node.lineno)  # type: ignore[attr-defined]
        src = Source("lambda" if is_lambda else "def", body, code.co_filename, node.lineno,  # type: ignore[attr-defined]
                     code.co_name, code.co_qualname, code.co_freevars, futures)
        try:
            compiled = compile_source(src)
        except (SyntaxError, SourceError, ValueError):
            continue
        if _same_code(compiled.target, code):
            return src
    if not candidates:
        raise SourceError(f"the definition of {what} cannot be found in {code.co_filename} at line "
                          f"{code.co_firstlineno}; the file was edited after it was loaded")
    raise SourceError(f"the source of {what} in {code.co_filename} (line {code.co_firstlineno}) no "
                      "longer matches the running code: the file was edited after it was loaded (or an import "
                      "hook, such as pytest's assertion rewriting, compiled other code from it). "
                      "Restart the program from the file, or capture before editing it")


def _within(node: ast.AST, pos: tuple[int, int]) -> bool:
    start = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = (node.end_lineno or node.lineno, node.end_col_offset or 1 << 30)  # type: ignore[attr-defined]
    return start <= pos <= end


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Same instructions, names and constants (line numbers and qualified names aside)."""
    fields = ("co_names", "co_varnames", "co_freevars", "co_cellvars", "co_argcount",
              "co_posonlyargcount", "co_kwonlyargcount", "co_name")
    if any(getattr(a, f) != getattr(b, f) for f in fields) or _shape(a) != _shape(b):
        return False
    ka = [c for c in a.co_consts if isinstance(c, types.CodeType)]
    kb = [c for c in b.co_consts if isinstance(c, types.CodeType)]
    if len(ka) != len(kb) or not all(_same_code(x, y) for x, y in zip(ka, kb, strict=True)):
        return False
    # Qualified names are constants of class bodies; the scaffold's differ until rewritten.
    qa = {x.co_qualname for x in ka} | {a.co_qualname}
    qb = {x.co_qualname for x in kb} | {b.co_qualname}
    va = [repr(c) for c in a.co_consts if not isinstance(c, types.CodeType) and c not in qa]
    vb = [repr(c) for c in b.co_consts if not isinstance(c, types.CodeType) and c not in qb]
    return va == vb


_JUMPS = set(dis.hasjrel) | set(dis.hasjabs) | set(getattr(dis, "hasjump", ()))


def _shape(code: types.CodeType) -> list[tuple[str, Any]]:
    """The instructions, blind to what the specializer leaves behind in code that has run
    (3.11: LOAD_METHOD becomes LOAD_ATTR, shifting jumps; 3.13: a method load becomes an
    attribute load and a PUSH_NULL)."""
    out = []
    for i in dis.get_instructions(code):
        if i.opname in ("PUSH_NULL", "NOP", "EXTENDED_ARG", "CACHE"):
            continue
        op = "LOAD_ATTR" if i.opname == "LOAD_METHOD" else i.opname
        arg = None if i.opcode in _JUMPS or isinstance(i.argval, types.CodeType) else i.argval
        out.append((op, arg))
    return out


def _class_text(cls: type) -> tuple[str, str, tuple[str, ...] | None, ast.Module]:
    """(filename, text, futures if known, tree) of the source that defines ``cls``."""
    qualname = cls.__qualname__
    own = [f.__code__ for f in class_functions(cls) if f.__qualname__.startswith(qualname + ".")]
    for code in own:  # a class made by code rebuilt here (a local class of a rebuilt function)
        hit = TEXTS.get(code)
        if hit is not None:
            return code.co_filename, hit[0], hit[1], _parse(code.co_filename, hit[0])
    module = sys.modules.get(cls.__module__)
    glb = module.__dict__ if module is not None else None
    # Where its own methods were compiled (a notebook cell, a string given to exec), or its
    # module's file; methods made by a library (namedtuple's) name files that do not exist.
    names = dict.fromkeys([c.co_filename for c in own] + [getattr(module, "__file__", None) or ""]
                          + (INTERACTIVE_FILES[::-1] if cls.__module__ == "__main__" else []))
    unreadable: tuple[str, int] | None = None
    for name in filter(None, names):
        text = _file_text(name, glb)
        if text is None:
            first = next((c.co_firstlineno for c in own if c.co_filename == name), 0)
            unreadable = unreadable or (name, first)
            continue
        try:
            tree = _parse(name, text)
        except SyntaxError:
            continue
        if any(q == qualname and isinstance(n, ast.ClassDef) for n, q in _qualnames(tree)):
            return name, text, None, tree
    if unreadable is not None:
        raise SourceError(_no_source(f"class {qualname}", *unreadable))
    where = next(filter(None, names), "its module")
    raise SourceError(f"the definition of class {qualname} cannot be found in {where}: it was created "
                      "by exec() or type(), or the file was edited after it was loaded; define it in "
                      "a file of the workspace")


def find_class_source(cls: type) -> Source:
    qualname = cls.__qualname__
    what = f"class {qualname}"
    filename, text, futures, tree = _class_text(cls)
    candidates = [n for n, q in _qualnames(tree) if q == qualname and isinstance(n, ast.ClassDef)]
    firstline = getattr(cls, "__firstlineno__", None)  # 3.13+
    own = [f.__code__.co_firstlineno for f in class_functions(cls)
           if f.__code__.co_filename == filename and f.__qualname__.startswith(qualname + ".")]
    if firstline is not None:
        candidates = [n for n in candidates if firstline in (n.lineno, _first_line(n))]
    elif own:
        candidates = [n for n in candidates if all(_first_line(n) <= ln <= (n.end_lineno or 0) for ln in own)]
    if not candidates:
        raise SourceError(f"the definition of {what} cannot be found in {filename}; the file was "
                          "edited after it was loaded")
    node = candidates[-1]  # redefinitions: the last one is the live one
    first = _first_line(node)
    enclosing = _enclosing_needs(cls, node, tree, text, filename) if "<locals>" in qualname else ()
    src = Source("class", _lines(text, node, first), filename, first, node.name, qualname,
                 enclosing, futures if futures is not None else _futures_of(tree))
    try:
        compiled = compile_source(src)
    except SyntaxError as e:
        raise SourceError(f"{what} cannot be compiled again from {filename}: {e}") from None
    # A property's getter and setter share a qualified name: tell them apart by first line
    # too (the scaffold keeps every line's number).
    by_qualname: dict[str, list[types.CodeType]] = {}
    for c in _walk_codes(compiled.target):
        by_qualname.setdefault(c.co_qualname, []).append(c)
    for f in class_functions(cls):
        same = by_qualname.get(f.__code__.co_qualname, [])
        at = [c for c in same if c.co_firstlineno == f.__code__.co_firstlineno]
        mine = at[0] if at else (same[-1] if same else None)
        if mine is not None and f.__code__.co_filename == filename and not _same_code(mine, f.__code__):
            raise SourceError(f"the source of {what} in {filename} (line {first}) no longer matches "
                              "the running code: the file was edited after it was loaded (or an "
                              "import hook, such as pytest's assertion rewriting, compiled other code "
                              "from it). Restart "
                              "the program from the file, or capture before editing it")
    return src


def _first_line(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def _qualnames(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    out: list[tuple[ast.AST, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                out.append((child, prefix + child.name))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((child, prefix + child.name))
                visit(child, prefix + child.name + ".<locals>.")
            elif isinstance(child, ast.Lambda):
                visit(child, prefix + "<lambda>.<locals>.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def class_functions(cls: type) -> list[types.FunctionType]:
    """The functions a class holds (through static/class methods and properties too)."""
    out = []
    for value in vars(cls).values():
        for f in unwrap(value):
            if isinstance(f, types.FunctionType):
                out.append(f)
    return out


def unwrap(value: Any) -> list[Any]:
    if isinstance(value, staticmethod | classmethod):
        return [value.__func__]
    if isinstance(value, property):
        return [value.fget, value.fset, value.fdel]
    return [value]


# -- classes defined inside a function -----------------------------------------------------------


def _enclosing_needs(cls: type, node: ast.ClassDef, tree: ast.Module, text: str, filename: str) -> tuple[str, ...]:
    """The names of the enclosing functions that the class statement or its methods use."""
    bound: set[str] = set()
    table = symtable.symtable(text, filename, "exec")
    for part in cls.__qualname__.split(".<locals>.")[:-1]:
        scope = None
        for name in part.split("."):
            kids = [t for t in table.get_children() if t.get_name() == name and t.get_lineno() <= node.lineno]
            if not kids:
                return ()
            scope = table = kids[-1]
        if scope is not None and scope.get_type() == "function":
            bound |= {s.get_name() for s in scope.get_symbols() if s.is_local()}
    used: set[str] = set()
    for f in class_functions(cls):
        used |= set(f.__code__.co_freevars)
    # Compiled with the methods' free variables bound, what else the statement reads is global.
    probe = Source("class", _lines(text, node, _first_line(node)), filename, _first_line(node), node.name,
                   cls.__qualname__, tuple(sorted(used - {node.name, "__class__"})), _futures_of(tree))
    try:
        used |= set(definition_names(_compile_scaffold(probe, False)))
    except SyntaxError as e:
        raise SourceError(f"class {cls.__qualname__} cannot be compiled again from {filename}: {e}") from None
    return tuple(sorted((used & bound) - {node.name, "__class__"}))


def mangling_class(qualname: str) -> str | None:
    """The innermost class around a definition: private names in it are mangled with its name."""
    parts = qualname.split(".")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i].isidentifier() and parts[i + 1] != "<locals>":
            return parts[i]
    return None


def _compile_scaffold(src: Source, own_global: bool) -> Compiled:
    mangle = mangling_class(src.qualname)
    params = ", ".join(v for v in src.freevars if not (mangle and v == "__class__"))
    flags = functools.reduce(lambda a, f: a | getattr(__future__, f).compiler_flag, src.futures, 0)
    local_class = src.kind == "class" and "<locals>" in src.qualname
    fn = local_class or bool(params) or own_global
    if src.kind == "lambda":
        head = [f"class {mangle}:\n"] if mangle else []
        body = (" " if mangle else "") + f"def {OUTER}({params}): return (" + src.text + ")\n"
        fn = True
    else:
        indent = src.text[: len(src.text) - len(src.text.lstrip(" \t"))]
        levels = ([f"class {mangle}:"] if mangle else []) + ([f"def {OUTER}({params}):"] if fn else [])
        if not levels and indent:
            levels = ["if 1:"]
        if len(levels) > len(indent):
            raise SourceError(f"{src.qualname} is indented too little to be compiled again")
        head = [indent[:i] + lvl + "\n" for i, lvl in enumerate(levels)]
        if own_global:
            head.append(f"{indent}global {src.name}\n")
        body = src.text + (f"{indent}return {src.name}\n" if local_class else "")
    text = "\n" * max(0, src.lineno - 1 - len(head)) + "".join(head) + body
    module = compile(text, src.filename, "exec", flags=flags, dont_inherit=True)
    target = _find_target(module, src, mangle, fn)
    if target.co_qualname != src.qualname:
        module = _requalify(module, target.co_qualname, src.qualname)
        target = _find_target(module, src, mangle, fn)
    return Compiled(module, target, text)


def _find_target(module: types.CodeType, src: Source, mangle: str | None, fn: bool) -> types.CodeType:
    scope = module
    for name in ([mangle] if mangle else []) + ([OUTER] if fn else []) + [src.name]:
        found = [c for c in scope.co_consts if isinstance(c, types.CodeType) and c.co_name == name]
        if not found:
            raise SourceError(f"the code of {src.qualname} cannot be found in its recompiled source")
        scope = found[-1]  # defaults and decorators are compiled first; the definition last
    return scope


def _requalify(code: types.CodeType, old: str, new: str) -> types.CodeType:
    consts = tuple(_requalify(c, old, new) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    qualname = code.co_qualname
    if qualname == old or qualname.startswith(old + "."):
        fixed = new + qualname[len(old):]
        if not code.co_flags & inspect.CO_OPTIMIZED:  # a class body: __qualname__ is a constant
            consts = tuple(fixed if type(c) is str and c == qualname else c for c in consts)
        qualname = fixed
    return code.replace(co_consts=consts, co_qualname=qualname)


def _walk_codes(code: types.CodeType) -> list[types.CodeType]:
    out = [code]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _walk_codes(c)
    return out


def compile_source(src: Source) -> Compiled:
    hit = _COMPILED.get(src)
    if hit is not None:
        return hit
    c = _compile_scaffold(src, False)
    if src.kind == "def" and src.name in c.target.co_freevars and src.name not in src.freevars:
        # It calls itself by a global name; the scaffold must not make that a closure.
        c = _compile_scaffold(src, True)
    _COMPILED[src] = c
    for code in _walk_codes(c.module):
        TEXTS[code] = (c.text, src.futures)
    if src.kind != "class":
        SOURCES[c.target] = src
    return c


_GLOBAL_OPS = {"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME",
               "DELETE_NAME", "LOAD_FROM_DICT_OR_GLOBALS"}


@functools.lru_cache(maxsize=4096)
def global_names(code: types.CodeType) -> frozenset[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= global_names(c)
    return frozenset(names)


def definition_names(compiled: Compiled) -> list[str]:
    """Global names a class statement reads while it runs (not those its methods read later)."""
    return statement_reads(compiled.module)


def statement_reads(module: types.CodeType) -> list[str]:
    """Global names the statements compiled in ``module`` read while they run: class bodies,
    decorators, defaults and comprehensions, not the functions they define."""
    names: dict[str, None] = {}

    def visit(code: types.CodeType) -> None:
        for i in dis.get_instructions(code):
            if i.opname in ("LOAD_NAME", "LOAD_GLOBAL", "LOAD_FROM_DICT_OR_GLOBALS"):
                names[i.argval] = None
        for c in code.co_consts:
            if isinstance(c, types.CodeType) and (
                c.co_name in _COMPREHENSIONS or c.co_name == OUTER or not c.co_flags & inspect.CO_OPTIMIZED
            ):
                visit(c)

    visit(module)
    return list(names)



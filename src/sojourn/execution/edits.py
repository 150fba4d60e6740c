"""Editing a program while it is paused: which edits a resume accepts, and how the paused
program is found again in the edited source.

A capsule records the text of every source of the program and the frames that stand at a
statement: the functions on the stack, the main script's module code, and every generator
that will carry on from where it stopped. A frame's **prefix** is its own code up to and
including the statement it stands at, in the normalized tree that statement ids number:

* a function's ``def`` header (decorators, name, parameters and their defaults);
* in each block on the way down to the statement: the statements before it, whole, and the
  header of each compound statement that holds it (a loop's target and iterator, the test
  of an ``if`` or ``while``, a ``with``'s manager, the ``try`` body and the handlers before
  the handler it is in, the cases before its case and its case's pattern);
* the statement itself, all of it as the source has it (with the temporaries the normal
  form hoisted out of it), a compound statement by its header;

where a nested ``def`` or ``class`` counts by its header (its body is another scope: its
functions are frames of their own or not on the stack at all), positions do not count
(comments, blank lines, indentation inside brackets are not in the tree), and a docstring
counts by its place, not its text.

An edit **touches** a frame when the frame's prefix differs between the captured source and
the current one, or when its function is gone (functions are matched by qualified name and
place among the functions of that name, :meth:`Layout.counterpart`). A resume refuses an
edit that touches a frame, naming the function and the line. Any other edit is accepted:
equal prefixes give the frame's statement the same path in the new tree, its enclosing
statements the same kinds and its temporaries the same names, so the frame's statement map
holds. The resume copy is then cut from the new tree, and everything after the statement,
every function not on the stack and every class statement is the new code (a class is made
again by its new statement). Values are the captured ones: a global or class attribute
whose assignment was edited keeps the value it had at the pause, as a statement that ran
does not run again.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any

from sojourn.execution import transform as T
from sojourn.execution.layout import Layout, Path

Pieces = list[tuple[int, str]]


@dataclass
class Remap:
    """From the captured layout of one source to its edited one."""

    old: Layout
    new: Layout
    _scopes: dict[str, str | None] = field(default_factory=dict)

    def scope(self, key: str) -> str:
        if key not in self._scopes:
            self._scopes[key] = self.old.counterpart(key, self.new) if key in self.old.scopes else None
        found = self._scopes[key]
        if found is None:
            qualname = self.old.scopes[key].qualname if key in self.old.scopes else key.rpartition("@")[0]
            raise LookupError(f"{qualname} (line {key.rpartition('@')[2]} of the captured source) is no longer in "
                              f"{self.new.filename}, and the program holds it; put it back to resume")
        return found

    def sid(self, sid: int) -> int:
        if sid < 0:
            return sid
        st = self.old.stmts[sid]
        new = self.new.sid_of(self.scope(st.scope), st.path)
        if new is None:  # cannot happen for a frame whose prefix is unchanged
            raise LookupError(f"line {st.line} of the captured {self.new.filename} has no counterpart in its edited version")
        return new

    def class_first(self, qualname: str, first: int) -> int:
        new = self.old.class_counterpart(qualname, first, self.new)
        if new is None:
            raise LookupError(f"class {qualname} (line {first} of the captured source) is no longer in "
                              f"{self.new.filename}, and the program holds it; put it back to resume")
        return new


@dataclass
class Change:
    """One source of the program that changed since the capture, and was accepted."""

    module: str
    path: str
    diff: str
    added: int
    removed: int
    remap: Remap

    def event(self) -> dict[str, Any]:
        return {"module": self.module, "path": self.path, "added": self.added, "removed": self.removed,
                "diff": self.diff}


def current_record(remaps: dict[str, Remap], rec: Any) -> Any:
    """``rec`` (a frame record of the capsule) with the scope and statement id of the edited
    source; ``rec`` itself when its source did not change."""
    remap = remaps.get(rec.module)
    if remap is None:
        return rec
    return dataclasses.replace(rec, scope=remap.scope(rec.scope), sid=remap.sid(rec.sid))


# -- prefixes ------------------------------------------------------------------------------------


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _dump(node: Any) -> str:
    """A canonical text of ``node`` as its own scope sees it: fields without positions,
    nested def/class bodies left out, docstrings by place only."""
    if isinstance(node, list):
        return "[" + ", ".join(_dump(n) for n in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return "Expr(<docstring>)"
    scope = isinstance(node, _SCOPES)
    fields = (f"{f}={_dump(getattr(node, f, None))}" for f in node._fields
              if f != "type_comment" and not (scope and f == "body"))
    return f"{type(node).__name__}(" + ", ".join(fields) + ")"


_HEADS = {ast.For: ("target", "iter"), ast.While: ("test",), ast.If: ("test",), ast.With: ("items",),
          ast.Match: ("subject",), ast.Try: (), ast.TryStar: ()}


def _head(S: ast.stmt) -> str:
    fields = _HEADS.get(type(S))
    if fields is None:
        return _dump(S)
    return f"{type(S).__name__}(" + ", ".join(_dump(getattr(S, f)) for f in fields) + ")"


def _whole(stmts: list[Any], out: Pieces) -> None:
    """Statements whole, a compound one as its header then its blocks (so that a difference
    is found at its line)."""
    for S in stmts:
        if isinstance(S, ast.ExceptHandler):
            out.append((S.lineno, _dump(S.type) + f" as {S.name}"))
            _whole(S.body, out)
        elif isinstance(S, ast.match_case):
            out.append((S.pattern.lineno, _dump(S.pattern) + _dump(S.guard)))
            _whole(S.body, out)
        elif type(S) in _HEADS:
            out.append((S.lineno, _head(S)))
            for name in ("body", "handlers", "orelse", "finalbody", "cases"):
                block = getattr(S, name, None)
                if block is not None:
                    out.append((S.lineno, f"<{name}>"))
                    _whole(block, out)
        else:
            out.append((getattr(S, "lineno", 0), _dump(S)))


def _block(stmts: list[ast.stmt], path: Path, out: Pieces) -> None:
    i = path[0][1]
    _whole(stmts[:i], out)
    if i >= len(stmts):
        out.append(((stmts[-1].end_lineno or 0) if stmts else 0, "<no statement here>"))
        return
    S = stmts[i]
    out.append((S.lineno, _head(S)))
    if len(path) > 1:
        _enter(S, path[1:], out)
        return
    # The paused statement is the whole statement of the source: a frame that stands before
    # the first temporary the normal form hoisted out of it stands before it.
    while _is_temporary(stmts[i]) and i + 1 < len(stmts):
        i += 1
        out.append((stmts[i].lineno, _head(stmts[i])))


def _is_temporary(S: ast.stmt) -> bool:
    return isinstance(S, ast.Assign) and all(isinstance(t, ast.Name) and t.id.startswith(T.TEMP) for t in S.targets)


def _enter(S: ast.stmt, path: Path, out: Pieces) -> None:
    field_, j = path[0]
    if not isinstance(getattr(S, field_, None), list):
        out.append((S.lineno, "<another statement>"))  # the edited tree has no such path
        return
    if isinstance(S, ast.For | ast.While | ast.If):
        if field_ == "orelse":
            _whole(S.body, out)
        _block(getattr(S, field_), path, out)
    elif isinstance(S, ast.With):
        _block(S.body, path, out)
    elif isinstance(S, ast.Try | ast.TryStar):
        if field_ == "body":
            _block(S.body, path, out)
            return
        _whole(S.body, out)
        if field_ == "orelse":
            _whole(S.handlers, out)
            _block(S.orelse, path, out)
            return
        _whole(S.handlers[:j], out)
        if j >= len(S.handlers):
            out.append((S.lineno, "<no handler>"))
            return
        H = S.handlers[j]
        out.append((H.lineno, _dump(H.type) + f" as {H.name}"))
        _block(H.body, path[1:], out)
    elif isinstance(S, ast.Match):
        _whole(S.cases[:j], out)
        case = S.cases[j] if j < len(S.cases) else None
        if case is None:
            out.append((S.lineno, "<no case>"))
            return
        out.append((case.pattern.lineno, _dump(case.pattern) + _dump(case.guard)))
        _block(case.body, path[1:], out)


def prefix(tree: ast.Module, defs: dict[str, ast.FunctionDef], scope: str, path: Path | None) -> Pieces:
    """The prefix (module docstring) of a frame of ``scope`` standing at the statement at
    ``path`` (None: at its start), as (line, canonical text) pieces in source order."""
    out: Pieces = []
    if scope == "<module>":
        body = tree.body
    else:
        F = defs[scope]
        out.append((F.lineno, _dump(F)))  # its body is dropped: the def header
        body = F.body
    if path:
        _block(body, path, out)
    return out


def first_difference(old: Pieces, new: Pieces) -> int | None:
    """The line, in the edited source, where two prefixes part (None when they are equal)."""
    for (_, a), (line, b) in zip(old, new, strict=False):
        if a != b:
            return line
    if len(old) == len(new):
        return None
    return new[len(old)][0] if len(new) > len(old) else (new[-1][0] if new else 1)


# -- the plan of a resume ------------------------------------------------------------------------


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    touched: list[str] = field(default_factory=list)  # edits inside a paused frame
    refused: list[str] = field(default_factory=list)  # every reason not to resume, those included


def _what(layout: Layout, scope: str) -> str:
    if scope == "<module>":
        return "the top-level code" if layout.module == "__main__" else f"the module code of {layout.module}"
    return f"{layout.scopes[scope].qualname}()"


def _check_frame(frame: dict[str, Any], old: tuple[ast.Module, Layout, dict[str, ast.FunctionDef]],
                 new: tuple[ast.Module, Layout, dict[str, ast.FunctionDef]], shown: str) -> str | None:
    (otree, olay, odefs), (ntree, nlay, ndefs) = old, new
    scope, sid = str(frame["scope"]), int(frame["sid"])
    at = f"line {olay.stmts[sid].line}" if sid >= 0 else "its start"
    what = _what(olay, scope)
    key = olay.counterpart(scope, nlay)
    if key is None:
        return f"{what} is no longer in {shown}, and it is paused at {at} (as captured)"
    path = olay.stmts[sid].path if sid >= 0 else None
    line = first_difference(prefix(otree, odefs, scope, path), prefix(ntree, ndefs, key, path))
    if line is None and (path is None or nlay.sid_of(key, path) is not None):
        return None
    return f"{shown}:{line} was edited inside {what}, which is paused at {at} (as captured)"


def plan(info: dict[str, Any], texts: dict[str, tuple[str, str | None]]) -> Plan:
    """What a resume does with the program's sources as they are now. ``texts``: per module,
    (the file's path now, its text or None when it is gone)."""
    out = Plan()
    frames = info.get("frames")
    base = os.path.dirname(info["script"])
    for name, src in info["sources"].items():
        path, text = texts[name]
        shown = os.path.relpath(path, base) if os.path.isabs(path) and path.startswith(base + os.sep) else path
        if text is not None and T.source_hash(text) == src["sha256"]:
            continue
        captured = src.get("text")
        if text is None:
            out.refused.append(f"{shown} is gone, and the paused program runs its code")
            continue
        if captured is None or frames is None:
            out.refused.append(f"{shown} changed, and the capsule (written by an older sojourn) does not hold "
                               "its source to compare with")
            continue
        try:
            old = T.normalise(captured, name, path)
            new = T.normalise(text, name, path)
        except T.TransformError as e:
            out.refused.append(f"{shown} does not parse now: {e}")
            continue
        if old[1].digest != src["digest"]:
            out.refused.append(f"this Python reads the captured {shown} into another statement layout than "
                               f"Python {info.get('python')} did; resume it with that version")
            continue
        trees = ((old[0], old[1], old[2]), (new[0], new[1], new[2]))
        problems = [p for fr in frames if fr.get("module") == name
                    for p in [_check_frame(fr, trees[0], trees[1], shown)] if p is not None]
        if problems:
            out.touched.extend(dict.fromkeys(problems))
            out.refused.extend(dict.fromkeys(problems))
            continue
        lines = list(difflib.unified_diff(captured.splitlines(keepends=True), text.splitlines(keepends=True),
                                          fromfile=f"{shown} (captured)", tofile=f"{shown} (now)"))
        diff = "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)
        added = sum(1 for ln in lines if ln.startswith("+") and not ln.startswith("+++"))
        removed = sum(1 for ln in lines if ln.startswith("-") and not ln.startswith("---"))
        out.changes.append(Change(name, shown, diff, added, removed, Remap(old[1], new[1])))
    return out

"""The layout of one transformed source: its scopes, numbered statements and wait sites.

:mod:`sojourn.execution.transform` fills a :class:`Layout` while it puts the source in normal
form; the runtime, the pause and resume code and the checkpoints read it. A statement is
named by its scope and its path in the normalized tree (``(("body", 3), ("orelse", 0))``), and
numbered by its index in the walk (its ``sid``); a site is keyed by its scope and the span of
its node, which is how a frame's current instruction is matched to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Span = tuple[int, int, int, int]
Path = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Scope:
    """A function of the source that runs in normal form (or an async one that does not)."""

    key: str  # "qualname@firstline": unique in one source, stable across Python versions
    qualname: str
    kind: str  # "module", "function", "generator" or "async"
    mangle: str | None  # the enclosing class name, for private-name mangling
    firstline: int


@dataclass(frozen=True)
class Stmt:
    scope: str
    path: Path
    line: int
    kind: str


@dataclass(frozen=True)
class Site:
    """A place where a frame can wait for a callee: a statement-level call, a ``for`` fetching
    its next item, or a statement-level ``yield``."""

    sid: int
    kind: str  # "call", "foriter", "yield", "yieldfrom"
    func: tuple[tuple[str, str], ...] | None = None  # static callee: (("n", "self"), ("a", "step"))
    itvar: str | None = None  # the local holding the iterator (for, yield from)
    arg0: tuple[tuple[str, str], ...] | None = None  # static first argument (next(g))


@dataclass
class Layout:
    """Everything the runtime needs to know about one transformed source."""

    module: str
    filename: str
    sha256: str
    scopes: dict[str, Scope] = field(default_factory=dict)
    stmts: list[Stmt] = field(default_factory=list)
    sites: dict[tuple[str, Span], Site] = field(default_factory=dict)
    ambiguous: set[tuple[str, Span]] = field(default_factory=set)
    with_cms: dict[int, str] = field(default_factory=dict)  # sid of a With -> its manager local
    classes: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # qualname -> (first, last line)
    toplevel: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (kind, names)
    catching: set[int] = field(default_factory=set)  # sids of try statements that may catch an OOM error
    digest: str = ""
    index: dict[tuple[str, Path], int] = field(default_factory=dict, repr=False, compare=False)

    def counterpart(self, key: str, other: Layout) -> str | None:
        """The scope of ``other`` (another version of this source) that stands where ``key``
        stands here: the same qualified name, and the same place among the scopes of that
        name (a redefinition, a ``def`` under ``if``/``else``). None when it is gone."""
        if key == "<module>":
            return key
        q = self.scopes[key].qualname
        mine = [k for k, sc in self.scopes.items() if sc.qualname == q]
        theirs = [k for k, sc in other.scopes.items() if sc.qualname == q]
        i = mine.index(key)
        return theirs[i] if i < len(theirs) else None

    def class_counterpart(self, qualname: str, first: int, other: Layout) -> int | None:
        """The first line, in ``other``, of the class statement that is ``qualname``'s at line
        ``first`` here (matched as :meth:`counterpart` matches scopes)."""
        mine = [f for f, _ in self.classes.get(qualname, [])]
        theirs = [f for f, _ in other.classes.get(qualname, [])]
        if first not in mine:
            return None
        i = mine.index(first)
        return theirs[i] if i < len(theirs) else None

    def sid_of(self, scope: str, path: Path) -> int | None:
        return self._indexed().get((scope, path))

    def _indexed(self) -> dict[tuple[str, Path], int]:
        if not self.index:
            self.index.update({(st.scope, st.path): i for i, st in enumerate(self.stmts)})
        return self.index

    def where(self, sid: int) -> str:
        st = self.stmts[sid]
        q = self.scopes[st.scope].qualname
        return f"{self.filename}:{st.line} in {q}"

    def in_loop(self, sid: int) -> bool:
        """Whether ``sid`` lies in the body of a loop of its own scope."""
        return any(self.stmts[a].kind in ("For", "While") for a in self.ancestors(sid))

    def guarded(self, sid: int) -> bool:
        """Whether a ``try`` of its scope whose handlers may catch an out-of-memory error
        encloses ``sid`` in its body (the program then handles the error itself)."""
        if not self.catching:
            return False
        index = self._indexed()
        st = self.stmts[sid]
        for k in range(1, len(st.path)):
            a = index.get((st.scope, st.path[:k]))
            if a is not None and a in self.catching and st.path[k][0] == "body":
                return True
        return False

    def ancestors(self, sid: int) -> list[int]:
        """Statements that enclose ``sid`` in its scope, outermost first."""
        index = self._indexed()
        st = self.stmts[sid]
        out = []
        for k in range(1, len(st.path)):
            if st.path[k - 1][0] in ("handlers", "cases"):
                continue
            a = index.get((st.scope, st.path[:k]))
            if a is not None:
                out.append(a)
        return out

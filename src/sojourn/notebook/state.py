"""A kernel's state as a capsule: the user's namespace, and IPython's own bookkeeping.

IPython keeps things in the user namespace that are not the user's (``In``, ``Out``, ``_``,
``_i3``, ``get_ipython``...). They must not travel as user variables: the destination kernel
has its own, and restoring ours over them would point ``get_ipython`` at a dead shell. But
the moved kernel must still behave like the old one (``Out[5]`` works, the execution count
continues), so IPython's history travels separately, in the capsule's process segment
(``capture(extra=...)``), pickled with the same memo as the namespace: ``Out[5] is x`` stays
true after the move.

The namespace is captured as the very ``user_ns`` dict (never a copy): functions defined in
cells have it as their globals, and the capsule records that by identity. IPython's names
are lifted out for the duration of the capture and put back afterwards.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sojourn.errors import CaptureError

# What IPython (and ipykernel) put in every user namespace. Compared by identity with
# ``user_ns_hidden`` where possible; these names are IPython's whatever their value.
_ALWAYS_IPYTHON = frozenset({"In", "Out", "_ih", "_oh", "_dh", "get_ipython", "exit", "quit",
                             "_", "__", "___", "_i", "_ii", "_iii", "_i00", "__builtin__",
                             "__builtins__", "__name__", "__doc__", "__package__", "__loader__",
                             "__spec__", "__session__", "_exit_code"})


def ipython_names(shell: Any) -> list[str]:
    """Names of ``shell.user_ns`` that belong to IPython, not to the user."""
    ns = shell.user_ns
    hidden = getattr(shell, "user_ns_hidden", {})
    out = []
    outputs = shell.history_manager.output_hist
    for name, value in ns.items():
        if not isinstance(name, str):
            continue
        if name in _ALWAYS_IPYTHON:
            out.append(name)
        elif name in hidden and hidden[name] is value:
            out.append(name)  # e.g. ipykernel's own `open`
        elif (name.startswith("_i") and name[2:].isdigit()) or (name.startswith("_") and name[1:].isdigit() and outputs.get(int(name[1:])) is value):
            out.append(name)
    return out


@contextlib.contextmanager
def user_namespace(shell: Any) -> Iterator[dict[str, Any]]:
    """``shell.user_ns`` with IPython's names lifted out while the block runs."""
    ns = shell.user_ns
    lifted = {n: ns.pop(n) for n in ipython_names(shell)}
    try:
        yield ns
    finally:
        ns.update(lifted)


@dataclass
class IPythonState:
    next_count: int  # the execution count the next cell gets
    inputs: list[str]  # In: parsed (transformed) sources, In[0] == ""
    raw: list[str]  # the sources as typed
    outputs: dict[int, Any]  # Out
    last: tuple[Any, Any, Any]  # _, __, ___
    dir_hist: list[str]
    extensions: list[str]
    cwd: str
    saved: float

    def to_extra(self) -> dict[str, Any]:
        return {"ipython": {
            "next_count": self.next_count, "inputs": self.inputs, "raw": self.raw,
            "outputs": self.outputs, "last": list(self.last), "dir_hist": self.dir_hist,
            "extensions": self.extensions, "cwd": self.cwd, "saved": self.saved,
        }}

    @classmethod
    def from_process(cls, process: dict[str, Any]) -> IPythonState | None:
        d = process.get("ipython")
        if not isinstance(d, dict):
            return None
        return cls(int(d["next_count"]), list(d["inputs"]), list(d["raw"]), dict(d["outputs"]),
                   tuple(d["last"]), list(d["dir_hist"]), list(d["extensions"]), str(d["cwd"]),
                   float(d.get("saved", 0.0)))


def ipython_state(shell: Any, *, in_cell: bool) -> IPythonState:
    """IPython's history now. IPython advances ``execution_count`` when a cell starts, so
    the count is the next cell's both inside a cell and after it; ``in_cell`` is kept for
    the record."""
    hm = shell.history_manager
    dh = shell.displayhook
    loaded: set[str] = getattr(getattr(shell, "extension_manager", None), "loaded", set())
    return IPythonState(
        next_count=int(shell.execution_count),
        inputs=list(hm.input_hist_parsed),
        raw=list(hm.input_hist_raw),
        outputs=dict(hm.output_hist),
        last=(getattr(dh, "_", ""), getattr(dh, "__", ""), getattr(dh, "___", "")),
        dir_hist=[str(d) for d in getattr(hm, "dir_hist", [])],
        extensions=sorted(str(e) for e in loaded if e != "sojourn"),
        cwd=os.getcwd(),
        saved=time.time(),
    )


def apply_ipython_state(shell: Any, st: IPythonState) -> list[str]:
    """Make ``shell`` continue where the captured one stopped; returns notes for people."""
    notes: list[str] = []
    hm = shell.history_manager
    hm.input_hist_parsed[:] = st.inputs
    hm.input_hist_raw[:] = st.raw
    hm.output_hist.clear()
    hm.output_hist.update(st.outputs)
    if hasattr(hm, "dir_hist"):
        hm.dir_hist[:] = st.dir_hist
    ns = shell.user_ns
    n = len(st.raw)
    # What IPython's store_inputs leaves after cell n-1: _i00 the last input, _i the one
    # before it... (see HistoryManager.store_inputs).
    recent = [st.raw[i] if 0 < i < n else "" for i in (n - 1, n - 2, n - 3, n - 4)]
    hm._i00, hm._i, hm._ii, hm._iii = recent
    ns.update({"_i": recent[1], "_ii": recent[2], "_iii": recent[3]})
    ns.update({f"_i{i}": st.raw[i] for i in range(1, n)})
    ns.update({f"_{k}": v for k, v in st.outputs.items()})
    dh = shell.displayhook
    dh._, dh.__, dh.___ = st.last
    ns.update({"_": st.last[0], "__": st.last[1], "___": st.last[2]})
    shell.execution_count = st.next_count
    if hasattr(dh, "prompt_count"):
        pass  # a property over shell.execution_count in IPython 8+
    if st.cwd and os.path.isdir(st.cwd):
        os.chdir(st.cwd)
    elif st.cwd:
        notes.append(f"the kernel ran in {st.cwd}, which does not exist here; it runs in {os.getcwd()}")
    for ext in st.extensions:
        try:
            shell.extension_manager.load_extension(ext)
        except Exception as e:  # an extension the destination lacks must not stop the kernel
            notes.append(f"extension {ext!r} could not be loaded again: {type(e).__name__}: {e}")
    return notes


def capture_kernel(shell: Any, repo: Any, *, in_cell: bool, parent: str | None = None,
                   labels: dict[str, Any] | None = None) -> tuple[Any, list[str]]:
    """Capture the kernel (user namespace + IPython history) into the open repository
    ``repo``; returns the manifest and notes for people.

    The kernel keeps its repository open between capsules (``ops.capture`` opens one per
    call): the chunk store remembers which chunks exist, which saves a ``stat`` per chunk of
    every array on every autosave. Outputs in ``Out`` that cannot travel (a figure holding
    a GUI handle...) are left out with a note rather than failing the capsule: they are
    history, not state. The user's own variables are never dropped: a problem there fails
    the capture with every path.
    """
    from sojourn.capsule.capture import capture_namespace

    _note_cell_files(shell)
    st = ipython_state(shell, in_cell=in_cell)
    notes: list[str] = []
    with user_namespace(shell) as ns:
        try:
            m = capture_namespace(ns, repo, parent=parent, labels=labels, extra=st.to_extra())
        except CaptureError as e:
            bad = _bad_outputs(st.outputs, e)
            if not bad:
                raise
            for k in bad:
                st.outputs.pop(k, None)
            notes.append("Out[" + "], Out[".join(map(str, sorted(bad))) + "] cannot travel and "
                         "were left out of the capsule")
            m = capture_namespace(ns, repo, parent=parent, labels=labels, extra=st.to_extra())
    return m, notes


def _note_cell_files(shell: Any) -> None:
    """Tell the source finder which files hold this kernel's cells, oldest first (a
    dataclass's methods are made from a string, so its cell is found by searching these)."""
    from sojourn.capsule.source import INTERACTIVE_FILES

    cells = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if isinstance(cells, dict):
        INTERACTIVE_FILES[:] = sorted(cells, key=lambda f: cells[f] or 0)


def _bad_outputs(outputs: dict[int, Any], err: CaptureError) -> list[int]:
    # Problems found only through the process segment (where Out lives), or in no variable.
    if not any(p.path.startswith(("<process>", "(inside <process>", "(an object no variable")) for p in err.problems):
        return []
    from sojourn import ops

    return [k for k, v in outputs.items() if ops.scan({"o": v}, rehearse=False)]  # refusals only

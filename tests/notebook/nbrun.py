"""Running real notebooks on the sojourn kernel with nbclient, optionally moving the kernel
to a fresh process before every cell, and reading what autosave did."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import nbformat
from jupyter_core.utils import run_sync
from nbclient import NotebookClient

# One expression: a name bound in the user's namespace would be captured by the next autosave.
AUTOSAVE_REPORT = (
    "print('@@' + __import__('json').dumps([dict(cell=r.cell, ok=r.ok, blocking=r.blocking, "
    "written=r.bytes_written, seconds=r.seconds, error=r.error) for r in "
    "(lambda a: a.wait(120) and a.history)(__import__('sojourn.notebook.magics', fromlist=['x'])"
    ".controller(get_ipython()).autosave)]))"
)


class SojournClient(NotebookClient):
    """Moves the kernel before each code cell but the first (``move_to``), and records
    each process the kernel ran in."""

    def __init__(self, nb: Any, pids: Any, move_to: str | None = None, **kw: Any):
        super().__init__(nb, kernel_name="sojourn", timeout=300, **kw)
        self.pids = pids
        self.move_to = move_to
        self.moves: list[dict[str, Any]] = []
        self.extra_outputs: list[str] = []

    async def async_execute_cell(self, cell: Any, cell_index: int, execution_count: Any = None,
                                 store_history: bool = True) -> Any:
        if cell_index == 0:
            self.pids.add(self.km)
        if self.move_to and cell_index > 0 and cell.cell_type == "code":
            before = self.pids.add(self.km)
            text = await self.run_quiet(f"%sojourn move --to {self.move_to}")
            after = self.pids.add(self.km)
            self.moves.append({"before": before, "after": after, "text": text})
        return await super().async_execute_cell(cell, cell_index, execution_count, store_history)

    async def run_quiet(self, code: str) -> str:
        """Run code outside the notebook's history (no execution count used)."""
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])

        assert self.kc is not None
        await self.kc._async_execute_interactive(code, store_history=False, timeout=300, output_hook=hook)
        return "".join(out)

    async def async_execute(self, reset_kc: bool = False, **kw: Any) -> Any:
        # nbclient's own, plus one quiet cell at the end that reports autosave
        self.autosave_report: list[dict[str, Any]] = []
        orig_cleanup = self._async_cleanup_kernel

        async def report_then_cleanup() -> None:
            if self.kc is not None:
                text = await self.run_quiet(AUTOSAVE_REPORT)
                self.extra_outputs.append(text)
                for line in text.splitlines():
                    if line.startswith("@@"):
                        self.autosave_report = json.loads(line[2:])
                self.pids.add(self.km)
            await orig_cleanup()

        self._async_cleanup_kernel = report_then_cleanup  # type: ignore[method-assign]
        return await super().async_execute(reset_kc=reset_kc, **kw)

    def execute(self, **kw: Any) -> Any:  # nbclient binds its own async_execute at class level
        return run_sync(self.async_execute)(**kw)


def load(path: Path) -> Any:
    return nbformat.read(path, as_version=4)


def run(path: Path, pids: Any, *, move_to: str | None = None) -> SojournClient:
    nb = copy.deepcopy(load(path))
    client = SojournClient(nb, pids, move_to=move_to)
    client.execute()
    return client


def outputs(client: SojournClient) -> list[tuple[Any, Any]]:
    """Each code cell's execution count and outputs, without transient metadata."""
    out = []
    for cell in client.nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for o in cell.outputs:
            o = dict(o)
            o.pop("metadata", None)
            outs.append(o)
        out.append((cell.execution_count, outs))
    return out

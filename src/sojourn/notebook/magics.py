"""``%load_ext sojourn``: the kernel becomes a workspace, and ``%sojourn`` drives it.

    %sojourn status                      workspace, machine, memory, state size, what cannot travel
    %sojourn checkpoint [--verify]       a capsule now
    %sojourn autosave on|off             a capsule after every cell, in the background
    %sojourn move --to MACHINE [--memory SIZE]   this kernel's process moves; same kernel id
    %sojourn fork NAME                   a new workspace from this state (open it in a kernel)
    %sojourn open WORKSPACE|CAPSULE      load a workspace's last capsule into this kernel
    %sojourn suspend [--on MACHINE]      capsule (checked), release the machine; the next cell resumes
    %sojourn autosuspend 30m|off         suspend when idle that long
    %sojourn resume WORKSPACE            load a workspace's last capsule here (as open)
    %sojourn resume --on MACHINE         where this kernel resumes after a suspend

One :class:`Controller` per shell holds the open repository (its chunk cache saves a stat per
chunk on every capsule), the kernel's workspace session and the autosaver.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Any

from sojourn.notebook.autosave import Autosaver, SaveResult
from sojourn.notebook.state import apply_ipython_state, capture_kernel, user_namespace

_CONTROLLERS: dict[int, Controller] = {}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Controller:
    def __init__(self, shell: Any, session: Any = None, notes: list[str] | None = None):
        from sojourn.ops import notebook as nb
        from sojourn.repository.repo import open_repository

        self.shell = shell
        self.repo = open_repository(os.environ.get("SOJOURN_REPO") or None, create=True)
        self.machine = os.environ.get("SOJOURN_MACHINE", "local")
        self.session = session or nb.open_kernel(
            self.repo.url, notebook=os.environ.get("JPY_SESSION_NAME") or None, machine=self.machine,
            name=os.environ.get("SOJOURN_WORKSPACE_NAME") or None)
        self.notes = list(notes or [])
        self.errors_shown: set[str] = set()
        self.autosave = Autosaver(self._capture_in_child, self._autosave_done, self._scheduler())
        self.autosave.head = self.session.last_capsule
        shell.events.register("pre_run_cell", self._pre)
        shell.events.register("post_run_cell", self._post)
        from sojourn.notebook import generators

        generators.install(shell)  # generator functions of cells resume from their source
        if os.environ.get("SOJOURN_AUTOSAVE", "").lower() in ("1", "on", "true", "yes"):
            self.autosave.enabled = True
        from sojourn.notebook.suspend import IdleSuspend, parse_duration

        self.resume_on: str | None = os.environ.get("SOJOURN_RESUME_ON") or None
        self.resumed: str | None = None  # how the last resume after a suspend went
        self.idle = IdleSuspend(self)
        try:
            self.idle.set(parse_duration(os.environ.get("SOJOURN_AUTOSUSPEND")))
        except ValueError as e:
            self.notes.append(f"SOJOURN_AUTOSUSPEND: {e}")

    def _scheduler(self) -> Any:
        kernel = getattr(self.shell, "kernel", None)
        if kernel is None:
            return None  # a terminal IPython: a coalesced save waits for the next cell

        def schedule(fn: Any) -> None:
            # Looked up when needed: the launcher installs the extension before the kernel
            # starts its loop. Tornado's add_callback is safe from the watcher thread.
            loop = getattr(kernel, "io_loop", None)
            if loop is not None:
                loop.add_callback(fn)

        return schedule

    # -- cell hooks ---------------------------------------------------------------------------

    def _pre(self, *args: Any) -> None:
        self.autosave.in_cell = True

    def _post(self, result: Any = None) -> None:
        self.autosave.in_cell = False
        try:
            self._report_autosave_errors()
            info = getattr(result, "info", None)
            # A cell that a front end runs for itself (a variable inspector, a completion
            # helper) does not go into history: it is not the user's work, nothing to save.
            if self.autosave.enabled and getattr(info, "store_history", True):
                self.autosave.after_cell(int(self.shell.execution_count) - 1)  # the count of the cell that ran
        except Exception as e:  # never let a save break the kernel
            print(f"sojourn: autosave could not start: {type(e).__name__}: {e}", file=sys.stderr)

    def _report_autosave_errors(self) -> None:
        last = self.autosave.last
        if last is not None and not last.ok and last.error and last.error not in self.errors_shown:
            self.errors_shown.add(last.error)
            print(f"sojourn: the autosave after cell {last.cell} failed; the kernel is fine, its "
                  f"last good capsule is {self.autosave.head}. Why:\n{last.error}", file=sys.stderr)

    # -- capsules -----------------------------------------------------------------------------

    def _labels(self, reason: str) -> dict[str, Any]:
        s = self.session
        return {"sojourn.workspace": {"workspace": s.workspace, "allocation": s.allocation, "epoch": s.epoch},
                "sojourn.kernel": {"reason": reason}}

    def _capture_in_child(self, parent: str | None) -> dict[str, Any]:
        from sojourn.repository.repo import open_repository

        with open_repository(self.repo.url) as r:  # fresh chunk-store threads in the child
            m, notes = capture_kernel(self.shell, r, in_cell=False, parent=parent, labels=self._labels("autosave"))
        return {"ok": True, "capsule": m.id, "size": m.size, "notes": notes,
                "bytes_written": int(m.stats.get("bytes_written", 0)),
                "chunks_new": int(m.stats.get("chunks_new", 0)), "seconds": float(m.stats.get("seconds_total", 0))}

    def _autosave_done(self, res: SaveResult) -> None:
        from sojourn.ops import notebook as nb

        if res.ok and res.capsule:
            nb.record_capsule(self.session, _Ref(res.capsule, res.parent, res.size), "autosave",
                              f"after cell {res.cell}")

    def checkpoint(self, reason: str = "checkpoint", *, in_cell: bool = True) -> tuple[Any, list[str], float]:
        from sojourn.ops import notebook as nb

        self.autosave.wait()
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.perf_counter()
        m, notes = capture_kernel(self.shell, self.repo, in_cell=in_cell, parent=self.autosave.head,
                                  labels=self._labels(reason))
        seconds = time.perf_counter() - t0
        self.autosave.head = m.id
        nb.record_capsule(self.session, m, reason, f"in cell {int(self.shell.execution_count) - 1}")
        return m, notes, seconds

    # -- verbs --------------------------------------------------------------------------------

    def status(self) -> str:
        from sojourn import ops

        s = self.session
        lines = [f"workspace   {s.name} ({s.workspace}), epoch {s.epoch}, allocation {s.allocation}",
                 f"repository  {s.repo}",
                 f"machine     {s.machine}: pid {os.getpid()} on {os.uname().nodename}, Python "
                 f"{sys.version.split()[0]} ({sys.executable})"]
        rss = _rss()
        limit = os.environ.get("SOJOURN_MEMORY")
        lines.append(f"memory      {_fmt_bytes(rss) if rss else '?'} resident"
                     + (f", limit {limit}" if limit else ""))
        with user_namespace(self.shell) as ns:
            names = [n for n in ns if not n.startswith("_")]
            problems = ops.scan(ns)
        lines.append(f"variables   {len(names)}")
        if self.autosave.head:
            from sojourn.capsule import format as fmt

            m = fmt.load_manifest(self.repo, self.autosave.head)
            lines.append(f"state       {_fmt_bytes(m.size)} in the last capsule {m.id}")
        else:
            lines.append("state       no capsule yet (%sojourn checkpoint)")
        a = self.autosave
        last = a.last
        if last is None:
            done = "none yet"
        elif last.ok:
            done = (f"last after cell {last.cell}: {_fmt_bytes(last.bytes_written)} written, "
                    f"{last.blocking * 1000:.1f} ms blocking, {last.seconds:.2f} s in the background")
        else:
            done = f"last after cell {last.cell} FAILED: {last.error}"
        lines.append(f"autosave    {'on' if a.enabled else 'off'}; {done}")
        idle = f"after {self.idle.seconds:g} s idle" if self.idle.seconds else "off"
        lines.append(f"suspend     autosuspend {idle}; resumes on {self.resume_machine()}"
                     + (f"; last idle suspend failed: {self.idle.last_error}" if self.idle.last_error else ""))
        if self.resumed:
            lines.append(f"            {self.resumed}")
        if problems:
            lines.append(f"cannot travel ({len(problems)}):")
            lines += [f"  - {p}" for p in problems]
        else:
            lines.append("cannot travel: nothing (every variable can be captured)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def move(self, to: str, memory: str | None) -> str:
        from sojourn.notebook import handover, machines

        machine = machines.resolve(to, memory, self.repo)
        return handover.move(self, machine)

    def fork(self, name: str) -> str:
        from sojourn.ops import notebook as nb

        m, notes, _ = self.checkpoint("fork")
        ws = nb.fork(self.session, m, name)
        extra = "".join(f"\nnote: {n}" for n in notes)
        return (f"forked {name} ({ws}) at {m.id}; this kernel stays on {self.session.name}.\n"
                f"Open the fork in another kernel with `%sojourn open {name}`{extra}")

    def open(self, ref: str) -> str:
        """Load a workspace's last capsule (or a capsule) here; this kernel then runs that
        workspace and its own is finished."""
        from sojourn import ops
        from sojourn.notebook.state import IPythonState
        from sojourn.ops import notebook as nb

        self.autosave.wait()
        ws: str | None = None
        cap: str | None = ref
        if not ref.startswith("cap_"):
            ws, cap = nb.last_capsule(self.repo.url, ref)
        if cap is None:
            raise ValueError(f"workspace {ref} has no capsule to open")
        restored = ops.restore(cap, self.repo.url, into=self.shell.user_ns)
        from sojourn.notebook.launcher import prime_generators

        prime_generators()
        notes = list(restored.notes)
        st = IPythonState.from_process(restored.process)
        if st is not None:
            notes += apply_ipython_state(self.shell, st)
        if ws is not None:
            nb.record_stop(self.session, "finished", detail=f"this kernel opened {ref}")
            self.session = nb.take_over(self.repo.url, ws, capsule=cap, machine=self.machine, moved_from=None)
        self.autosave.head = cap
        names = [v.name for v in restored.manifest.variables if v.name != "<process>"]
        return (f"opened {ref} ({cap}): {len(names)} variable(s) in {restored.timings['total']:.2f} s"
                + "".join(f"\nnote: {n}" for n in notes))

    def resume_machine(self) -> str:
        return self.resume_on or self.machine

    def suspend(self, on: str | None = None) -> str:
        from sojourn.notebook import machines
        from sojourn.notebook.suspend import suspend

        machine = machines.resolve(on or self.resume_machine(), None, self.repo)
        return suspend(self, machine)


class _Ref:
    def __init__(self, id: str, parent: str | None, size: int):
        self.id, self.parent, self.size = id, parent, size


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%sojourn", add_help=False, exit_on_error=False)
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("status")
    c = sub.add_parser("checkpoint")
    c.add_argument("--verify", action="store_true")
    a = sub.add_parser("autosave")
    a.add_argument("state", choices=["on", "off"], nargs="?")
    m = sub.add_parser("move")
    m.add_argument("--to", required=True)
    m.add_argument("--memory")
    f = sub.add_parser("fork")
    f.add_argument("name")
    o = sub.add_parser("open")
    o.add_argument("ref")
    s = sub.add_parser("suspend")
    s.add_argument("--on")
    i = sub.add_parser("autosuspend")
    i.add_argument("after", nargs="?")
    r = sub.add_parser("resume")
    r.add_argument("ref", nargs="?")
    r.add_argument("--on")
    return p


def sojourn_magic(line: str) -> Any:
    from sojourn.errors import SojournError
    from sojourn.notebook.handover import MoveFailed

    shell = _get_ipython()
    ctl = _CONTROLLERS.get(id(shell))
    if ctl is None:
        ctl = install(shell)
    try:
        args = _parser().parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit) as e:
        print(f"%sojourn: {e}\n{__doc__.split(chr(10) + chr(10))[0]}", file=sys.stderr)
        return None
    try:
        out = _run(ctl, args)
    except (SojournError, MoveFailed, ValueError, ConnectionError, TimeoutError, OSError) as e:
        print(f"%sojourn {args.cmd or ''}: {e}", file=sys.stderr)
        return None
    if out:
        print(out)
    return None


def _run(ctl: Controller, args: argparse.Namespace) -> str:
    if args.cmd in (None, "status"):
        return ctl.status()
    if args.cmd == "checkpoint":
        m, notes, secs = ctl.checkpoint()
        text = (f"checkpoint {m.id}: {_fmt_bytes(m.size)}, {_fmt_bytes(m.stats.get('bytes_written', 0))} "
                f"written in {secs:.2f} s" + "".join(f"\nnote: {n}" for n in notes))
        if args.verify:
            from sojourn import ops

            rep = ops.verify(m.id, ctl.repo.url)
            text += "\nverified in a fresh interpreter" if rep.ok else f"\nVERIFY FAILED: {rep.error}"
        return text
    if args.cmd == "autosave":
        if args.state is not None:
            ctl.autosave.enabled = args.state == "on"
        return f"autosave {'on' if ctl.autosave.enabled else 'off'}"
    if args.cmd == "move":
        return ctl.move(args.to, args.memory)
    if args.cmd == "fork":
        return ctl.fork(args.name)
    if args.cmd == "open":
        return ctl.open(args.ref)
    if args.cmd == "suspend":
        return ctl.suspend(args.on)
    if args.cmd == "autosuspend":
        from sojourn.notebook.suspend import parse_duration

        if args.after is not None:
            ctl.idle.set(parse_duration(args.after))
        return f"autosuspend after {ctl.idle.seconds:g} s idle" if ctl.idle.seconds else "autosuspend off"
    if args.cmd == "resume":
        if args.on:
            from sojourn.notebook import machines

            machines.resolve(args.on, None, ctl.repo)  # an unknown machine is refused now, not at resume
            ctl.resume_on = args.on
        if args.ref:
            return ctl.open(args.ref)
        return f"after a suspend this kernel resumes on {ctl.resume_machine()}"
    raise ValueError(f"unknown command {args.cmd}")


def _get_ipython() -> Any:
    from IPython import get_ipython

    return get_ipython()


def install(shell: Any, session: Any = None, notes: list[str] | None = None) -> Controller:
    ctl = _CONTROLLERS.get(id(shell))
    if ctl is None:
        ctl = Controller(shell, session, notes)
        _CONTROLLERS[id(shell)] = ctl
        shell.register_magic_function(sojourn_magic, "line", "sojourn")
        loaded = getattr(getattr(shell, "extension_manager", None), "loaded", None)
        if isinstance(loaded, set):
            loaded.add("sojourn")
    return ctl


def controller(shell: Any) -> Controller | None:
    return _CONTROLLERS.get(id(shell))


def load_ipython_extension(shell: Any) -> None:
    install(shell)


def unload_ipython_extension(shell: Any) -> None:
    ctl = _CONTROLLERS.pop(id(shell), None)
    if ctl is not None:
        ctl.autosave.enabled = False
        ctl.autosave.wait(30)
        shell.events.unregister("pre_run_cell", ctl._pre)
        shell.events.unregister("post_run_cell", ctl._post)

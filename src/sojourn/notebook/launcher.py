"""The sojourn kernel process: ``python -m sojourn.notebook.launcher -f CONNECTION_FILE``.

An ipykernel with three differences:

* as a move's destination (``$SOJOURN_HANDOFF``, set by the provisioner) it says hello on
  the control channel, imports ipykernel and reads the kernel's previous capsule
  (``prefetch.py``) while the source is still capturing, restores the capsule it is sent
  (fingerprints checked), says "ready", and binds the kernel's ports only on "go", after the
  source released them. A restore that fails, or an ipykernel whose IOPub cannot be held,
  is reported and this process exits: the source keeps running;
* with ``$SOJOURN_RESUME`` (a workspace or capsule) it starts from that workspace's last
  capsule: a notebook opened again, a fork opened in its own kernel;
* the sojourn extension is loaded, so the kernel is a workspace from its first cell;
* as a warm standby (``$SOJOURN_STANDBY_FD``, ``standby.py``) it imports all that first and
  waits to be claimed by a launch, then continues as that launch.

The restored namespace is handed to IPython as its ``user_ns`` (never copied: restored
functions use that very dict as their globals), then IPython's history is put back.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def _limit_memory() -> None:
    text = os.environ.get("SOJOURN_MEMORY")
    if not text:
        return
    import resource

    limit = int(text)
    # RLIMIT_DATA, not RLIMIT_AS: see docs/workspaces.md (thread stacks and BLAS reservations).
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _restore(plan: dict[str, Any], prefetch: Any = None) -> tuple[dict[str, Any], Any, list[str], float, str]:
    from sojourn.capsule.restore import restore_capsule
    from sojourn.notebook.state import IPythonState
    from sojourn.repository.repo import open_repository

    # A move takes what the prefetch already read and checked (called once, before the
    # restore allocates anything else).
    reuse = prefetch.reuse if prefetch is not None else None
    t0 = time.perf_counter()
    ns: dict[str, Any] = {}
    with open_repository(plan["repo"]) as r:
        restored = restore_capsule(r, plan["capsule"], into=ns, reuse=reuse)
    prime_generators()
    st = IPythonState.from_process(restored.process)
    parts = ", ".join(f"{k} {v:.2f}" for k, v in restored.timings.items() if k != "total")
    if prefetch is not None:
        parts += f"; {prefetch.summary()}"
    return ns, st, list(restored.notes), time.perf_counter() - t0, parts


def prime_generators() -> None:
    """Run the generators a restore rebuilt (cells' generator functions) up to where they
    stood, once the whole capsule is loaded, as a resumed script does."""
    reducers = sys.modules.get("sojourn.execution.reducers")
    if reducers is not None:
        reducers.prime_rebuilt()


def _wait_as_standby(fd: int) -> dict[str, Any]:
    """A warm standby (``notebook/standby.py``): import what a kernel needs, say ready, wait
    for a launch to claim this process, then become that launch (its argv, environment and
    working directory). The channel closing (the provisioner or its process is gone) ends it."""
    import socket

    from sojourn.notebook import control

    ch = control.Channel(socket.socket(fileno=fd))
    import ipykernel.kernelapp  # noqa: F401

    from sojourn.capsule import restore  # noqa: F401
    from sojourn.notebook.handover import preload

    names = [n for n in os.environ.get("SOJOURN_PRELOAD", "").split(",") if n]
    preload(names)
    ready = time.time()
    try:
        ch.send({"op": "ready"})
        job = ch.recv(timeout=None)["assign"]
    except (EOFError, OSError, KeyError, ValueError):
        os._exit(0)  # nobody will claim this standby
    claimed = time.time()
    ch.close()
    start_dir = os.getcwd()
    os.chdir(job["cwd"])
    if sys.path and sys.path[0] == start_dir:  # ``-m`` put the standby's directory there
        sys.path[0] = os.getcwd()
    os.environ.clear()
    os.environ.update(job["env"])
    sys.argv[1:] = list(job["argv"])
    return {"pid": os.getpid(), "preloaded": names, "launch": float(job["t"]),
            "timeline": [("standby ready", ready), ("launch", float(job["t"])), ("claimed", claimed)]}


def _standby_note(standby: dict[str, Any], timeline: list[tuple[str, float]]) -> str:
    t0 = standby["launch"]
    steps = ", ".join(f"{name} {t - t0:+.2f}" for name, t in sorted(timeline, key=lambda x: x[1])
                      if name != "spawned")
    return (f"this kernel is a warm standby that the launch claimed (pid {standby['pid']}, preloaded: "
            f"{', '.join(standby['preloaded']) or 'ipykernel only'}); timeline from the launch: {steps}")


def _inline_backend_default() -> None:
    """The matplotlib backend ipykernel gives every kernel, set before a restore can import
    matplotlib: matplotlib reads $MPLBACKEND when it is imported, and ipykernel sets it only
    in ``initialize``, after the restore. (The same rule as ipykernel's: a value set wins.)"""
    if not os.environ.get("MPLBACKEND"):
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"


def _inline_figures() -> None:
    """What importing the inline backend does in a kernel (figures shown as images after a
    cell, ``Out`` holding a figure displays it), when a restore imported it before the shell
    existed. Nothing when it was not imported: it does this itself when it is, later."""
    mod = sys.modules.get("matplotlib_inline.backend_inline")
    enable = getattr(mod, "_enable_matplotlib_integration", None)
    if enable is not None:
        try:
            enable()
        except Exception as e:
            print(f"sojourn: matplotlib's inline figures could not be turned on again: {e}", file=sys.__stderr__)


def main() -> None:
    from sojourn.notebook import control

    # Before any import; a standby's limit is its launch's too (the memory limit is part of
    # the pool's key, standby.py).
    _limit_memory()
    _inline_backend_default()
    fd = os.environ.pop("SOJOURN_STANDBY_FD", None)
    standby = _wait_as_standby(int(fd)) if fd else None
    _inline_backend_default()  # a claimed standby has its launch's environment now
    token = os.environ.pop("SOJOURN_HANDOFF", None)
    resume = os.environ.pop("SOJOURN_RESUME", None)
    plan: dict[str, Any] | None = None
    ch = None
    handoff: dict[str, Any] | None = None
    info: dict[str, Any] = {"machine": os.environ.get("SOJOURN_MACHINE", "local"), "notes": [],
                            "timeline": [("started", time.time())]}
    spawned = os.environ.pop("SOJOURN_SPAWNED", None)
    if spawned:  # set by the provisioner: the interpreter's own start-up shows in the timeline
        info["timeline"].insert(0, ("spawned", float(spawned)))
    if standby is not None:
        info["timeline"][:0] = standby["timeline"]
        info["standby"] = standby
    prefetch = None
    ns: dict[str, Any] | None = None
    st = None
    if token:
        ch = control.connect()
        ch.send({"op": "hello", "token": token, "pid": os.getpid()})
        from sojourn.notebook.prefetch import ENV, Prefetch

        prefetch = Prefetch.from_env(os.environ.pop(ENV, None))
        if prefetch is not None:  # reads in its thread while this one imports
            prefetch.start()
        import ipykernel.kernelapp  # noqa: F401  (while the source captures)

        from sojourn.capsule import restore  # noqa: F401
        from sojourn.notebook.handover import preload

        preload([n for n in os.environ.pop("SOJOURN_PRELOAD", "").split(",") if n])

        info["timeline"].append(("imported", time.time()))
        plan = ch.recv(timeout=None).get("restore")
        if plan is None:
            sys.exit(0)
        from sojourn.notebook.handover import iopub_hold_unsupported

        why = iopub_hold_unsupported()
        if why is not None:  # said now, while the source still runs: the move is called off
            ch.send({"op": "failed", "error": why})
            sys.exit(3)
        info["timeline"].append(("capsule", time.time()))
    elif resume:
        from sojourn.ops import notebook as nb

        try:
            # the kernelspec's resume="notebook": this notebook's own workspace
            ws, cap = nb.resume_target(os.environ.get("SOJOURN_REPO") or None, resume,
                                       os.environ.get("JPY_SESSION_NAME") or None)
            plan = {"capsule": cap, "workspace": ws, "repo": os.environ.get("SOJOURN_REPO") or None,
                    "moved_from": None}
            if cap is None:
                if resume != "notebook":  # a notebook with no suspended workspace just starts empty
                    info["notes"].append(f"workspace {resume} has no capsule; the kernel starts empty")
                plan = None
        except Exception as e:
            info["notes"].append(f"could not resume {resume}: {e}; the kernel starts empty")
    if plan is not None:
        try:
            ns, st, notes, info["restore_s"], info["restore_parts"] = _restore(plan, prefetch)
            info["timeline"].append(("restored", time.time()))
            info["notes"] += notes
        except Exception as e:
            if ch is not None:
                ch.send({"op": "failed", "error": f"{type(e).__name__}: {e}"})
                sys.exit(3)
            info["notes"].append(f"could not resume {resume}: {type(e).__name__}: {e}; the kernel starts empty")
            ns = st = plan = None
    if ch is not None:
        ch.send({"op": "ready", "restore_s": info.get("restore_s")})
        try:
            handoff = ch.recv(timeout=None).get("go")
        except EOFError:
            sys.exit(0)  # the move was called off: the source runs on
        info["timeline"].append(("go", time.time()))
    if standby is not None:
        info["notes"].append(_standby_note(standby, [*info["timeline"], ("kernel starts", time.time())]))
    _start_kernel(ns, st, plan, handoff, info)


def _start_kernel(ns: dict[str, Any] | None, st: Any, plan: dict[str, Any] | None,
                  handoff: dict[str, Any] | None, info: dict[str, Any]) -> None:
    from ipykernel.kernelapp import IPKernelApp

    from sojourn.notebook import handover, magics
    from sojourn.notebook.state import apply_ipython_state

    app = IPKernelApp.instance(user_ns=ns) if ns is not None else IPKernelApp.instance()
    seen_holder: dict[str, Any] = {}

    original_init_iopub = app.init_iopub

    def init_iopub(context: Any) -> None:
        original_init_iopub(context)
        if handoff is not None:  # hold IOPub until the client subscribes again (before it can)
            seen_holder["seen"] = handover.watch_subscriptions(app)

    app.init_iopub = init_iopub  # type: ignore[method-assign]
    original_init_sockets = app.init_sockets

    def init_sockets() -> None:
        original_init_sockets()
        if handoff is not None:  # the shell ROUTER drops replies to a client not yet back
            seen_holder["shell"] = handover.watch_connections(app.shell_socket)

    app.init_sockets = init_sockets  # type: ignore[method-assign]
    restored_names = list(ns or ())
    app.initialize(sys.argv[1:])
    shell = app.shell
    assert shell is not None
    # IPython hides whatever is in user_ns at start-up from %who (hide_initial_ns), and
    # sojourn lifts hidden names out of a capture: the restored variables are the user's.
    for name in restored_names:
        shell.user_ns_hidden.pop(name, None)
    _inline_figures()
    notes = list(info["notes"])
    if st is not None:
        notes += apply_ipython_state(shell, st)
    session = None
    if plan is not None and plan.get("workspace"):
        from sojourn.ops import notebook as nb

        try:
            session = nb.take_over(plan["repo"], plan["workspace"], capsule=plan["capsule"],
                                   machine=info["machine"], moved_from=plan.get("moved_from"))
        except Exception as e:
            notes.append(f"this kernel could not take its workspace {plan['workspace']}: {e}; a new one was made")
    if hasattr(app.kernel, "shell_main"):  # ipykernel 7: know every request a move must hand over
        handover.track_requests(app.kernel)
    ctl = magics.install(shell, session, notes)
    if os.environ.get("SOJOURN_STANDBY_LEARN"):  # the provisioner's standbys preload what kernels import
        from sojourn.notebook.standby import report_libraries

        report_libraries(shell)
    if plan is not None:
        ctl.autosave.head = plan["capsule"]
    if handoff is not None:  # the kernel's own settings go with it
        if handoff.get("autosave"):
            ctl.autosave.enabled = True
        if handoff.get("resume_on"):
            ctl.resume_on = str(handoff["resume_on"])
        if handoff.get("autosuspend"):
            ctl.idle.set(float(handoff["autosuspend"]))
    if handoff is not None:
        import asyncio

        from tornado.ioloop import IOLoop

        IOLoop.current().add_callback(lambda: asyncio.ensure_future(
            handover.deliver(app, handoff, {**info, "notes": notes}, seen_holder.get("shell"))))
    elif notes:
        for n in notes:
            print(f"sojourn: {n}", file=sys.__stderr__)
    app.start()


if __name__ == "__main__":
    main()

"""Handing a live kernel from one process to another without the notebook noticing.

The source (``%sojourn move`` running in cell N):

1. asks the provisioner to start the destination, and captures the kernel meanwhile;
2. sends the capsule; the destination restores it and checks every fingerprint while the
   source still runs and still owns the ports. Any failure up to here (no machine, a
   restore error, a fingerprint mismatch, a timeout, Ctrl-C) ends the move: the destination
   is killed and cell N reports why; the kernel is where it was;
3. on "release", the source hands over what the notebook is waiting for (the reply to cell N:
   its client identity and message header) and the requests already queued behind cell N
   (a "Run All"), then exits without a word, freeing its ports.

The destination then binds the same ports (the provisioner waits for the source to exit),
waits until the notebook's client has reconnected (the first IOPub subscription; zmq
reconnects on its own), and answers cell N itself: a line of output, the ``execute_reply``
and the ``idle`` status, with cell N's header as parent. Queued requests run next. To the
client it was one long cell on one kernel.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

from sojourn.notebook import control

MOVE_TIMEOUT = float(os.environ.get("SOJOURN_MOVE_TIMEOUT", "900"))


class MoveFailed(RuntimeError):
    pass


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _bytes(f: Any) -> bytes:
    return bytes(f.bytes) if hasattr(f, "bytes") else bytes(f)


def current_request(kernel: Any) -> tuple[list[bytes], dict[str, Any]]:
    """The client identity and header of the shell request being executed."""
    parent = kernel.get_parent("shell")
    try:
        idents = kernel._get_shell_context_var(kernel._shell_parent_ident)  # ipykernel 7
    except AttributeError:
        idents = kernel._parent_ident.get("shell")  # ipykernel 6
    return [_bytes(i) for i in (idents or [])], _plain(parent.get("header", {}))


def drain_queued(kernel: Any) -> list[list[bytes]]:
    """Requests received but not yet started (they wait behind the running cell)."""
    import zmq

    thread = getattr(kernel, "shell_channel_thread", None)
    sock = None
    if thread is not None:
        pair = getattr(thread.manager, "_shell_channel_to_main", None)
        sock = getattr(pair, "to_socket", None)
    if sock is None:
        return []
    out = []
    while True:
        try:
            out.append([_bytes(f) for f in sock.recv_multipart(zmq.NOBLOCK)])
        except zmq.Again:
            return out


def installed_packages() -> list[str]:
    """Top-level installed packages this kernel imported: the destination imports them while
    the source captures, so that the restore does not wait for pandas and friends."""
    import site

    roots = (*site.getsitepackages(), site.getusersitepackages())
    out = []
    for name, mod in list(sys.modules.items()):
        if "." in name or name.startswith("_") or name == "sojourn":
            continue
        f = getattr(mod, "__file__", None) or ""
        if f.startswith(roots):
            out.append(name)
    return sorted(out)


def preload(names: list[str]) -> None:
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # the restore says what is really missing


def move(ctl: Any, machine: Any) -> str:
    kernel = getattr(ctl.shell, "kernel", None)
    if kernel is None:
        raise MoveFailed("only a Jupyter kernel can move (this is a terminal IPython)")
    t0 = time.time()
    ch = control.connect()
    try:
        ch.send({"op": "move", "machine": machine.name, "python": machine.python, "memory": machine.memory,
                 "preload": installed_packages()})
        m, notes, capture_s = ctl.checkpoint("move")
        ch.send({"capsule": m.id, "repo": ctl.repo.url, "workspace": ctl.session.workspace,
                 "moved_from": ctl.session.allocation, "machine": machine.name})
        ans = ch.recv(timeout=MOVE_TIMEOUT)
    except BaseException:
        ch.close()  # the provisioner takes a closed channel as "cancel" and kills the destination
        raise
    if ans.get("status") != "release":
        ch.close()
        raise MoveFailed(f"the move to {machine.name} failed; this kernel stays where it was. "
                         f"Why: {ans.get('error')}")
    # The point of no return: the destination holds the restored state and waits for the ports.
    idents, header = current_request(kernel)
    handoff = {
        "idents": control.pack_frames(idents), "header": header,
        "execution_count": int(ctl.shell.execution_count) - 1,  # advanced when the cell began
        "queued": [control.pack_frames(f) for f in drain_queued(kernel)],
        "t0": t0, "capture_s": capture_s, "autosave": bool(ctl.autosave.enabled), "capsule": m.id, "size": m.size,
        "bytes_written": int(m.stats.get("bytes_written", 0)), "notes": notes,
        "from": {"pid": os.getpid(), "machine": ctl.machine, "python": sys.version.split()[0]},
    }
    try:
        ch.send({"handoff": handoff})
        ch.recv(timeout=10)
    except Exception:
        pass
    os._exit(0)  # no atexit: the kernel's sockets must simply close, nothing more is sent


# -- the destination's side --------------------------------------------------------------------


def watch_subscriptions(app: Any) -> threading.Event:
    """An event set at the first IOPub subscription: the notebook's client is back."""
    seen = threading.Event()
    iot: Any = getattr(app, "iopub_thread", None)
    stream = getattr(iot, "_xpub_stream", None)
    if iot is None or stream is None:
        seen.set()  # an older ipykernel: no way to tell; deliver() waits a fixed time instead
        return seen
    original = iot._handle_subscription

    def on_sub(frames: Any) -> None:
        original(frames)
        if any(len(f) and _bytes(f)[0] == 1 for f in frames):
            seen.set()

    iot.io_loop.add_callback(lambda: stream.on_recv(on_sub))
    return seen


def watch_connections(sock: Any) -> threading.Event:
    """An event set when a client has connected to ``sock`` (the shell ROUTER) and finished
    the handshake: a reply sent before that is dropped by the ROUTER without a word."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    seen = threading.Event()
    event = getattr(zmq, "EVENT_HANDSHAKE_SUCCEEDED", zmq.EVENT_ACCEPTED)
    mon = sock.get_monitor_socket(event)

    def drain() -> None:
        # Keeps reading so that later connections never fill the monitor's queue.
        while True:
            try:
                recv_monitor_message(mon)
            except Exception:
                return
            seen.set()

    threading.Thread(target=drain, name="sojourn-shell-monitor", daemon=True).start()
    return seen


async def deliver(app: Any, handoff: dict[str, Any], seen: threading.Event, info: dict[str, Any],
                  shell_seen: threading.Event | None = None) -> None:
    """Answer the cell that asked for the move, then run what was queued behind it."""
    kernel = app.kernel
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (seen.is_set() and (shell_seen is None or shell_seen.is_set())):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)
    parent = {"header": handoff["header"]}
    idents = control.unpack_frames(handoff["idents"])
    took = time.time() - float(handoff["t0"])
    src = handoff["from"]
    text = (f"moved to {info.get('machine')} (pid {src['pid']} -> {os.getpid()}, Python {src['python']} -> "
            f"{sys.version.split()[0]}) in {took:.2f} s: capsule {handoff['capsule']} "
            f"({handoff['size'] / 2**20:.1f} MiB, {handoff['bytes_written'] / 2**20:.1f} MiB written), "
            f"capture {handoff['capture_s']:.2f} s, restore {info.get('restore_s', 0):.2f} s "
            f"({info.get('restore_parts', '')})\n")
    text += "".join(f"note: {n}\n" for n in [*handoff.get("notes", []), *info.get("notes", [])])
    kernel.session.send(kernel.iopub_socket, "stream", {"name": "stdout", "text": text}, parent,
                        ident=kernel._topic("stream"))
    content = {"status": "ok", "execution_count": handoff["execution_count"], "user_expressions": {}, "payload": []}
    metadata = {"started": handoff["header"].get("date"), "dependencies_met": True, "engine": kernel.ident,
                "status": "ok"}
    kernel.session.send(_reply_socket(kernel), "execute_reply", content, parent, metadata=metadata, ident=idents)
    kernel._publish_status("idle", "shell", parent)
    for frames in handoff.get("queued", []):
        import zmq

        await kernel.shell_main(None, [zmq.Frame(f) for f in control.unpack_frames(frames)])


def _reply_socket(kernel: Any) -> Any:
    thread = getattr(kernel, "shell_channel_thread", None)
    if thread is not None:  # ipykernel 7: the main thread replies through its pair socket
        return thread.manager.get_subshell_to_shell_channel_socket(None)
    return kernel.shell_stream


def suspend(ctl: Any) -> str:
    raise MoveFailed(
        "suspending a live kernel is not implemented yet: the provisioner must hold the kernel's "
        "ports while no process runs. Until then: `%sojourn checkpoint`, shut the kernel down, and "
        "start it again with SOJOURN_RESUME=<workspace> (or `%sojourn open <workspace>`)")

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
waits until the notebook's client has reconnected to the shell socket (zmq reconnects on its
own), holds every IOPub message until the client has subscribed again (``watch_subscriptions``),
and answers cell N itself: a line of output, the ``execute_reply``
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
# 0: the destination reads the whole capsule after the capture (the benchmark's other side)
PREFETCH = os.environ.get("SOJOURN_MOVE_PREFETCH", "1") != "0"


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


class _Arrivals:
    """Shell requests the main thread has read but not started. ipykernel 7 reads each
    request off its inproc socket as soon as the event loop turns (between cells, inside
    async cells) and parks it in a task that waits for the cell lock; those are no longer in
    any socket, so a move or a suspend must know them to hand them over."""

    def __init__(self) -> None:
        self.waiting: list[Any] = []
        self.last_activity = time.monotonic()


ARRIVALS = _Arrivals()


def track_requests(kernel: Any) -> None:
    """Record requests from their arrival to their dispatch (call before the kernel starts).

    The arrival is recorded in the inproc stream's receive callback itself, synchronously: a
    request read in the same loop turn as the cell that then blocks gets a task that has not
    even started when that cell hands over."""
    start, shell_main, dispatch = kernel.start, kernel.shell_main, kernel.dispatch_shell

    def tracked_start(*args: Any, **kw: Any) -> Any:
        out = start(*args, **kw)
        thread = getattr(kernel, "shell_channel_thread", None)
        pair = getattr(getattr(thread, "manager", None), "_shell_channel_to_main", None)
        stream = getattr(pair, "to_stream", None)
        received = getattr(stream, "_recv_callback", None)
        if stream is not None and received is not None:
            def arrived(msg: Any) -> Any:
                ARRIVALS.last_activity = time.monotonic()
                ARRIVALS.waiting.append(msg)
                return received(msg)

            stream.on_recv(arrived, copy=False)
        return out

    async def tracked_main(subshell_id: Any, msg: Any) -> Any:
        try:
            return await shell_main(subshell_id, msg)
        finally:
            _forget(msg)

    async def tracked_dispatch(msg: Any, *args: Any, **kw: Any) -> Any:
        _forget(msg)
        ARRIVALS.last_activity = time.monotonic()
        try:
            return await dispatch(msg, *args, **kw)
        finally:
            ARRIVALS.last_activity = time.monotonic()

    kernel.start = tracked_start
    kernel.shell_main = tracked_main
    kernel.dispatch_shell = tracked_dispatch


def _forget(msg: Any) -> None:
    for i, m in enumerate(ARRIVALS.waiting):
        if m is msg:
            del ARRIVALS.waiting[i]
            return


def drain_queued(kernel: Any) -> list[list[bytes]]:
    """Requests received but not yet started (they wait behind the running cell): those the
    main thread already read, then those still in its inproc socket, in arrival order."""
    import zmq

    out = [[_bytes(f) for f in m] for m in ARRIVALS.waiting]
    ARRIVALS.waiting.clear()
    thread = getattr(kernel, "shell_channel_thread", None)
    sock = None
    if thread is not None:
        pair = getattr(thread.manager, "_shell_channel_to_main", None)
        sock = getattr(pair, "to_socket", None)
    if sock is None:
        return out
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
        try:
            ch.send({"op": "move", "machine": machine.name, "python": machine.python, "memory": machine.memory,
                     "preload": installed_packages(),
                     # most of the move's chunks are the last autosave's: the destination reads those now
                     "prefetch": {"capsule": ctl.autosave.head, "repo": ctl.repo.url}
                     if ctl.autosave.head and PREFETCH else None})
        except OSError as e:  # the provisioner went away after it accepted the connection
            ans = {"status": "failed", "error": f"the kernel provisioner did not take the request ({e})"}
        else:
            m, notes, capture_s = ctl.checkpoint("move")
            ans = answer(ch, {"capsule": m.id, "repo": ctl.repo.url, "workspace": ctl.session.workspace,
                              "moved_from": ctl.session.allocation, "machine": machine.name}, MOVE_TIMEOUT)
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
        "t0": t0, "capture_s": capture_s, "capsule": m.id, "size": m.size,
        "bytes_written": int(m.stats.get("bytes_written", 0)), "notes": notes,
        "from": {"pid": os.getpid(), "machine": ctl.machine, "python": sys.version.split()[0]},
        **carry(ctl),
    }
    hand_over_and_exit(ch, kernel, handoff)
    raise AssertionError("unreachable")


def answer(ch: control.Channel, doc: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
    """Send ``doc`` (when not None) and return the provisioner's answer, whatever the timing.

    The provisioner may have given up on the move while this kernel was still capturing (the
    destination died at start, a slow capture on a loaded machine): it then answered "failed"
    and closed the connection, so the send meets a closed socket (EPIPE) while the reason
    already waits in this side's receive buffer, readable after the peer's close. Reading it
    is what keeps "the kernel stays where it was, and why" true at any speed. A channel that
    ends without an answer is a failure too, never a bare socket error."""
    sent_error: OSError | None = None
    if doc is not None:
        try:
            ch.send(doc)
        except OSError as e:
            sent_error = e
    try:
        return ch.recv(timeout=timeout)
    except TimeoutError:
        return {"status": "failed", "error": f"the kernel provisioner did not answer within {timeout:g} s"}
    except (EOFError, OSError, ValueError) as e:
        why = sent_error or e
        return {"status": "failed", "error": f"the kernel provisioner ended the move without saying why ({why})"}


def carry(ctl: Any) -> dict[str, Any]:
    """The kernel's own settings that its next process keeps."""
    return {"autosave": bool(ctl.autosave.enabled), "autosuspend": ctl.idle.seconds,
            "resume_on": ctl.resume_on}


def hand_over_and_exit(ch: control.Channel, kernel: Any, handoff: dict[str, Any]) -> None:
    """Send the requests queued behind the current one with ``handoff``, then exit at once.

    The queue is read as late as possible and nothing is awaited after it: a request that
    arrives later stays in the client's zmq queue (or in this process's socket buffers for
    the microseconds before exit, the one window left: see docs/notebooks.md) and reaches
    the next process when zmq reconnects."""
    handoff["queued"] = [control.pack_frames(f) for f in drain_queued(kernel)]
    try:
        ch.send({"handoff": handoff})
    finally:
        os._exit(0)  # no atexit: the kernel's sockets must simply close, nothing more is sent


# -- the destination's side --------------------------------------------------------------------


IOPUB_HOLD = float(os.environ.get("SOJOURN_IOPUB_HOLD", "60"))
# ipykernel has no public hook for "a client subscribed" nor for holding IOPub messages: the
# hold wraps two methods of its IOPub thread, as they are in ipykernel 7.4 (XPUB welcome,
# JEP 65). iopub_hold_unsupported() checks them before a destination takes a move on.
_HOLD_NEEDS = {"_really_send": ("self", "msg"), "_send_welcome_message": ("self", "subscription")}


def iopub_hold_unsupported() -> str | None:
    """Why this ipykernel's IOPub messages cannot be held until the client subscribes again,
    or None when they can (or when the hold is turned off: ``SOJOURN_IOPUB_HOLD=0``)."""
    if IOPUB_HOLD <= 0:
        return None
    import inspect

    try:
        import ipykernel
        from ipykernel.iostream import IOPubThread
    except Exception as e:
        return f"ipykernel cannot be imported here ({type(e).__name__}: {e})"
    version = getattr(ipykernel, "__version__", "?")
    wrong = []
    for name, params in _HOLD_NEEDS.items():
        fn = getattr(IOPubThread, name, None)
        try:
            got = tuple(inspect.signature(fn).parameters)[:len(params)] if callable(fn) else ()
        except (TypeError, ValueError):
            got = ()
        if got != params:
            wrong.append(f"IOPubThread.{name}({', '.join(params[1:])})")
    if not wrong:
        return None
    return (f"the destination's ipykernel {version} has no {' or '.join(wrong)} (ipykernel 7.4 has both): "
            "sojourn cannot hold the kernel's output until the notebook subscribes again, so output of "
            "cells run right after the move could be lost. Use an ipykernel like the source's on the "
            "destination, or set SOJOURN_IOPUB_HOLD=0 in the kernel's environment to move without the hold")


def watch_subscriptions(app: Any) -> threading.Event:
    """An event set at the first IOPub subscription: the notebook's client is back.

    Until then every IOPub message is held, not sent: the XPUB would drop it (no
    subscriber), and the client may take long to subscribe again. A zmq SUB socket
    resends its subscription after a reconnect only when its owner next touches it (the
    reconnect queues a "hiccup" command that the socket processes in its own thread): a
    Jupyter server polls IOPub all the time, but a client blocked on a shell reply does not,
    and would lose the output of every cell the new process runs before that reply. The
    held messages go out right after the subscription's ``iopub_welcome``, or after
    ``$SOJOURN_IOPUB_HOLD`` seconds (60) if nobody subscribes."""
    seen = threading.Event()
    iot: Any = getattr(app, "iopub_thread", None)
    send = getattr(iot, "_really_send", None)
    welcome = getattr(iot, "_send_welcome_message", None)
    if IOPUB_HOLD <= 0 or iot is None or send is None or welcome is None:
        # turned off, or (the launcher checked iopub_hold_unsupported() before the move's
        # point of no return) a stand-in's kernel without one: nothing is held
        seen.set()
        return seen
    held: list[tuple[Any, Any, Any]] = []

    def release() -> None:  # on the IOPub thread, like every send
        if seen.is_set():
            return
        seen.set()
        iot._really_send = send
        for msg, args, kw in held:
            send(msg, *args, **kw)
        held.clear()

    def hold(msg: Any, *args: Any, **kw: Any) -> None:
        if seen.is_set():
            send(msg, *args, **kw)
        else:
            held.append((msg, args, kw))

    def on_welcome(subscription: str) -> None:
        welcome(subscription)  # JEP 65: the welcome is the first message a subscriber sees
        release()

    # Both are looked up on the instance at each call (send_multipart schedules
    # ``self._really_send``; ``_handle_subscription`` calls ``self._send_welcome_message``).
    iot._really_send = hold
    iot._send_welcome_message = on_welcome
    iot.io_loop.add_callback(lambda: iot.io_loop.call_later(IOPUB_HOLD, release))
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


async def deliver(app: Any, handoff: dict[str, Any], info: dict[str, Any],
                  shell_seen: threading.Event | None = None) -> None:
    """Answer the cell that asked for the move, then run what was queued behind it."""
    kernel = app.kernel
    # IOPub messages wait for the client's subscription by themselves (watch_subscriptions);
    # a shell reply sent before the client's DEALER is back would be dropped by the ROUTER.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and shell_seen is not None and not shell_seen.is_set():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)
    for frames in handoff.get("iopub", []):  # what the stand-in published that nobody received yet
        kernel.iopub_socket.send_multipart(control.unpack_frames(frames))
    if not handoff.get("header"):  # a resume: nobody waits for an answer, the requests run
        from sojourn.notebook import magics

        ctl = magics.controller(kernel.shell)
        if ctl is not None:  # not printed: it would land in the output of the cell that woke the kernel
            ctl.resumed = (f"resumed on {info.get('machine')} (pid {os.getpid()}) in "
                           f"{time.time() - float(handoff.get('t_wake', time.time())):.2f} s, restore "
                           f"{info.get('restore_s', 0):.2f} s ({info.get('restore_parts', '')})")
        await _replay(kernel, handoff)
        return
    parent = {"header": handoff["header"]}
    idents = control.unpack_frames(handoff["idents"])
    took = time.time() - float(handoff["t0"])
    src = handoff["from"]
    text = (f"moved to {info.get('machine')} (pid {src['pid']} -> {os.getpid()}, Python {src['python']} -> "
            f"{sys.version.split()[0]}) in {took:.2f} s: capsule {handoff['capsule']} "
            f"({handoff['size'] / 2**20:.1f} MiB, {handoff['bytes_written'] / 2**20:.1f} MiB written), "
            f"capture {handoff['capture_s']:.2f} s, restore {info.get('restore_s', 0):.2f} s "
            f"({info.get('restore_parts', '')})\n")
    steps = [*info.get("timeline", []), ("answered", time.time())]
    text += ("timeline after the command: source captured " + f"{handoff['capture_s']:.2f} s; destination "
             + ", ".join(f"{name} {t - float(handoff['t0']):+.2f}" for name, t in steps) + "\n")
    text += "".join(f"note: {n}\n" for n in [*handoff.get("notes", []), *info.get("notes", [])])
    kernel.session.send(kernel.iopub_socket, "stream", {"name": "stdout", "text": text}, parent,
                        ident=kernel._topic("stream"))
    content = {"status": "ok", "execution_count": handoff["execution_count"], "user_expressions": {}, "payload": []}
    metadata = {"started": handoff["header"].get("date"), "dependencies_met": True, "engine": kernel.ident,
                "status": "ok"}
    kernel.session.send(_reply_socket(kernel), "execute_reply", content, parent, metadata=metadata, ident=idents)
    kernel._publish_status("idle", "shell", parent)
    await _replay(kernel, handoff)


async def _replay(kernel: Any, handoff: dict[str, Any]) -> None:
    import zmq

    for frames in handoff.get("queued", []):
        await kernel.shell_main(None, [zmq.Frame(f) for f in control.unpack_frames(frames)])


def _reply_socket(kernel: Any) -> Any:
    thread = getattr(kernel, "shell_channel_thread", None)
    if thread is not None:  # ipykernel 7: the main thread replies through its pair socket
        return thread.manager.get_subshell_to_shell_channel_socket(None)
    return kernel.shell_stream

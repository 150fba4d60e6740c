"""The stand-in of a suspended kernel: ``python -m sojourn.notebook.stub -f CONNECTION_FILE``.

A suspended kernel has written its capsule (checked) and exited: its machine is free. The
notebook must not notice: Jupyter knows the kernel by its id, its connection file (ports,
key) and its provisioner's ``poll()``. This process keeps all three true with almost no
memory (pyzmq and jupyter_client's Session, no IPython, no numpy):

* it binds the kernel's five ports, echoes heartbeats, answers ``kernel_info`` (with the
  suspended kernel's own reply, so a front end that reconnects sees the same language) and
  ``shutdown``/``interrupt`` on the control channel;
* it answers the ``%sojourn suspend`` cell that suspended the kernel (its output line, the
  ``execute_reply``, ``idle``), once the client has reconnected;
* any other shell request (a cell, a completion...) wakes the kernel: it asks the provisioner
  to resume the workspace on the chosen machine (the move path: restore, check, swap), keeps
  reading the shell socket while that runs, and on "release" hands every request it holds
  to the resumed kernel and exits. A resume that fails answers the waiting cells with the
  reason; the kernel stays suspended and the next cell tries again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import zmq
from jupyter_client.session import Session

from sojourn.notebook import control


def _addr(info: dict[str, Any], port: str) -> str:
    if info.get("transport", "tcp") == "ipc":
        return f"ipc://{info['ip']}-{info[port]}"
    return f"tcp://{info['ip']}:{info[port]}"


class Stub:
    def __init__(self, info: dict[str, Any], plan: dict[str, Any]):
        self.plan = plan
        self.session = Session(key=info["key"].encode(), signature_scheme=info.get("signature_scheme", "hmac-sha256"),
                               username="kernel")
        ctx: zmq.Context[Any] = zmq.Context.instance()
        self.shell = ctx.socket(zmq.ROUTER)
        self.control = ctx.socket(zmq.ROUTER)
        self.stdin = ctx.socket(zmq.ROUTER)
        self.iopub = ctx.socket(zmq.XPUB)
        self.hb = ctx.socket(zmq.REP)
        event = getattr(zmq, "EVENT_HANDSHAKE_SUCCEEDED", zmq.EVENT_ACCEPTED)
        self.monitor = self.shell.get_monitor_socket(event)
        for sock, port in ((self.shell, "shell_port"), (self.control, "control_port"), (self.stdin, "stdin_port"),
                           (self.iopub, "iopub_port"), (self.hb, "hb_port")):
            sock.linger = 1000
            sock.bind(_addr(info, port))
        self.subscribed = False
        self.connected = False
        # IOPub messages published before the client subscribed (again): a zmq SUB resends its
        # subscription after a reconnect only when its owner next touches it, and an XPUB
        # drops what nobody subscribed to. Sent on subscription, or handed to the resumed
        # kernel, which holds them the same way.
        self.unsent: list[list[bytes]] = []
        self.held: list[list[bytes]] = []  # requests that wait for the resumed kernel
        self.waking: control.Channel | None = None
        self.carry: dict[str, Any] = {}  # the kernel's settings its resumed process keeps

    # -- messages -------------------------------------------------------------------------------

    def _publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        msg = self.session.msg(msg_type, content, parent)
        frames = [bytes(f) for f in self.session.serialize(msg, ident=f"kernel.stub.{msg_type}".encode())]
        if self.subscribed:
            self.iopub.send_multipart(frames)
        else:
            self.unsent.append(frames)

    def on_subscribed(self) -> None:
        if self.subscribed:
            return
        self.subscribed = True
        # JEP 65: a subscriber's first message is the welcome, then what waited for it.
        welcome = self.session.msg("iopub_welcome", {"subscription": ""}, {})
        self.iopub.send_multipart(self.session.serialize(welcome))
        for frames in self.unsent:
            self.iopub.send_multipart(frames)
        self.unsent = []

    def _status(self, state: str, parent: dict[str, Any]) -> None:
        self._publish("status", {"execution_state": state}, parent)

    def _parse(self, frames: list[bytes]) -> tuple[list[bytes], dict[str, Any]] | None:
        try:
            idents, rest = self.session.feed_identities(frames)
            return idents, self.session.deserialize(rest)
        except Exception:
            return None  # not signed with the kernel's key: ignored, as ipykernel does

    def answer_suspend_cell(self, handoff: dict[str, Any]) -> None:
        """The reply to the cell that suspended the kernel: its client is waiting for it."""
        header = handoff.get("header")
        if not header:
            return  # an idle suspend: nobody waits
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self.connected:  # the ROUTER drops replies to the unknown
            self.poll_once(50)
        parent = {"header": header}
        self._publish("stream", {"name": "stdout", "text": handoff.get("text", "suspended\n")}, parent)
        content = {"status": "ok", "execution_count": handoff.get("execution_count", 0), "user_expressions": {},
                   "payload": []}
        self.session.send(self.shell, "execute_reply", content, parent,
                          ident=control.unpack_frames(handoff.get("idents", [])))
        self._status("idle", parent)

    def on_shell(self, frames: list[bytes]) -> None:
        parsed = self._parse(frames)
        if parsed is None:
            return
        idents, msg = parsed
        if msg["header"].get("msg_type") == "kernel_info_request" and self.waking is None:
            self._status("busy", msg)
            self.session.send(self.shell, "kernel_info_reply", {"status": "ok", **self.plan.get("kernel_info", {})},
                              msg, ident=idents)
            self._status("idle", msg)
            return
        self.held.append(frames)
        if self.waking is None:
            self._status("busy", msg)
            self.wake()

    def on_control(self, frames: list[bytes]) -> None:
        parsed = self._parse(frames)
        if parsed is None:
            return
        idents, msg = parsed
        kind = msg["header"].get("msg_type", "")
        if kind == "kernel_info_request":
            self.session.send(self.control, "kernel_info_reply",
                              {"status": "ok", **self.plan.get("kernel_info", {})}, msg, ident=idents)
        elif kind == "interrupt_request":
            self.session.send(self.control, "interrupt_reply", {"status": "ok"}, msg, ident=idents)
        elif kind == "shutdown_request":
            restart = bool(msg["content"].get("restart", False))
            self.session.send(self.control, "shutdown_reply", {"status": "ok", "restart": restart}, msg,
                              ident=idents)
            self._publish("shutdown_reply", {"status": "ok", "restart": restart}, msg)
            self.close()
            os._exit(0)  # the workspace stays suspended at its capsule

    # -- waking up --------------------------------------------------------------------------------

    def wake(self) -> None:
        self.carry["t_wake"] = time.time()
        try:
            self.waking = control.connect()
            self.waking.send({"op": "wake"})
        except (ConnectionError, OSError) as e:
            self.waking = None
            self.fail(f"the kernel provisioner does not answer ({e})")

    def on_wake_answer(self) -> None:
        assert self.waking is not None
        try:
            ans = self.waking.recv(timeout=0.5)
        except TimeoutError:
            return  # a partial line: the rest comes
        except (EOFError, OSError) as e:
            ans = {"status": "failed", "error": f"the provisioner closed the channel ({e})"}
        if ans.get("status") != "release":
            self.waking.close()
            self.waking = None
            self.fail(str(ans.get("error") or ans))
            return
        # The resumed kernel holds the restored state and waits for the ports: hand it every
        # request read so far, then exit at once (whatever comes later waits in the client's
        # queue and reaches the resumed kernel when zmq reconnects).
        self.drain()
        self.waking.send({"handoff": {**self.carry, "header": None,
                                      "queued": [control.pack_frames(f) for f in self.held],
                                      "iopub": [control.pack_frames(f) for f in self.unsent]}})
        os._exit(0)

    def fail(self, why: str) -> None:
        """Answer every waiting request: the kernel could not resume and stays suspended."""
        text = (f"sojourn: the suspended kernel could not resume: {why}\nIt stays suspended at capsule "
                f"{self.plan.get('capsule')}; run the cell again to retry, or `%sojourn resume "
                f"{self.plan.get('workspace')}` in a new kernel.")
        for frames in self.held:
            parsed = self._parse(frames)
            if parsed is None:
                continue
            idents, msg = parsed
            kind = msg["header"].get("msg_type", "")
            if kind == "execute_request":
                self._publish("error", {"ename": "SuspendedKernelError", "evalue": why, "traceback": [text]}, msg)
            reply = kind.replace("_request", "_reply") if kind.endswith("_request") else "error_reply"
            self.session.send(self.shell, reply, {"status": "error", "ename": "SuspendedKernelError",
                                                  "evalue": why, "traceback": [text]}, msg, ident=idents)
            self._status("idle", msg)
        self.held = []

    # -- the loop ---------------------------------------------------------------------------------

    def drain(self) -> None:
        while True:
            try:
                self.held.append(self.shell.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return

    def poll_once(self, timeout_ms: int) -> None:
        poller = zmq.Poller()
        for s in (self.shell, self.control, self.iopub, self.hb, self.monitor, self.stdin):
            poller.register(s, zmq.POLLIN)
        if self.waking is not None:
            poller.register(self.waking.sock.fileno(), zmq.POLLIN)
        ready = dict(poller.poll(timeout_ms))
        if self.hb in ready:
            self.hb.send(self.hb.recv())
        if self.iopub in ready:
            sub = self.iopub.recv()
            if sub[:1] == b"\x01":
                self.on_subscribed()
        if self.monitor in ready:
            self.monitor.recv_multipart()
            self.connected = True
        if self.stdin in ready:
            self.stdin.recv_multipart()  # nothing asks for input while suspended
        if self.control in ready:
            self.on_control(self.control.recv_multipart())
        if self.shell in ready:
            self.on_shell(self.shell.recv_multipart())
        if self.waking is not None and self.waking.sock.fileno() in ready:
            self.on_wake_answer()

    def run(self) -> None:
        while True:
            self.poll_once(1000)

    def close(self) -> None:
        for s in (self.shell, self.control, self.stdin, self.iopub, self.hb, self.monitor):
            s.close(linger=200)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt while suspended: nothing runs to stop
    args = sys.argv[1:]
    cf = args[args.index("-f") + 1]
    with open(cf) as f:
        info = json.load(f)
    token = os.environ.pop("SOJOURN_HANDOFF", "")
    ch = control.connect()
    ch.send({"op": "hello", "token": token, "pid": os.getpid()})
    plan = ch.recv(timeout=None).get("stand_in")
    if plan is None:
        sys.exit(0)
    ch.send({"op": "ready"})
    try:
        handoff = ch.recv(timeout=None).get("go") or {}
    except EOFError:
        sys.exit(0)  # the suspend was called off: the kernel runs on
    ch.close()
    stub = Stub(info, plan)
    stub.carry = dict(handoff.get("carry") or {})
    stub.answer_suspend_cell(handoff)
    for frames in handoff.get("queued", []):  # requests behind the suspend cell: resume for them
        stub.on_shell(control.unpack_frames(frames))
    stub.run()


if __name__ == "__main__":
    main()

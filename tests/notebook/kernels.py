"""A sojourn kernel driven directly with jupyter_client (the fork and failure tests)."""

from __future__ import annotations

import os
from typing import Any


class Kernel:
    def __init__(self, pids: Any, *, kernel: str = "sojourn", **env: str):
        from jupyter_client.manager import KernelManager

        self.pids = pids
        self.closed = False
        self.km = KernelManager(kernel_name=kernel)
        self.km.start_kernel(env={**os.environ, **env})
        self.pids.add(self.km)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return self.pids.add(self.km)

    def run(self, code: str, store_history: bool = True) -> tuple[str, str, dict[str, Any]]:
        """(stdout and results, stderr and errors, the reply's content)."""
        out: list[str] = []
        err: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            c = msg["content"]
            if msg["msg_type"] == "stream":
                (out if c["name"] == "stdout" else err).append(c["text"])
            elif msg["msg_type"] == "execute_result":
                out.append(c["data"].get("text/plain", ""))
            elif msg["msg_type"] == "error":
                err.append(f"{c['ename']}: {c['evalue']}")

        reply = self.kc.execute_interactive(code, timeout=300, output_hook=hook, store_history=store_history)
        self.pids.add(self.km)
        return "".join(out), "".join(err), reply["content"]

    def out(self, code: str) -> str:
        out, err, _ = self.run(code)
        assert not err, err
        return out.strip()

    def wait_serving(self, seconds: float = 120) -> None:
        """Ask for kernel_info until the process now holding the ports answers. A request sent
        in the instant the kernel's process changes is written by the client's zmq into the
        connection that just died, and lost (docs/notebooks.md, "Limits"): a client that
        sends right after it saw the old process exit must first see the new one serve."""
        import queue
        import time

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg_id = self.kc.kernel_info()
            try:
                while True:
                    msg = self.kc.get_shell_msg(timeout=5)
                    if msg["parent_header"].get("msg_id") == msg_id:
                        return
            except queue.Empty:
                continue
        raise TimeoutError(f"the kernel's process did not answer kernel_info within {seconds} s")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)

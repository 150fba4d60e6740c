"""Suspend: the kernel's process writes a checked capsule and exits (its machine is free), a
light stand-in holds the kernel id and ports, and the next request resumes the workspace in
a new process with everything (variables, ``Out``, execution count) where it was."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.notebook.conftest import _alive
from tests.notebook.kernels import Kernel


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _wait_dead(pid: int, seconds: float = 20) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _events(repo: Path, name: str) -> list[dict[str, Any]]:
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.store import WorkspaceStore

    with open_repository(str(repo)) as r:
        store = WorkspaceStore(r)
        return list(store.events(store.resolve(name)))


def _stubbed(k: Kernel) -> int:
    pid = k.pid
    assert "sojourn.notebook.stub" in _cmdline(pid), _cmdline(pid)
    return pid


def test_suspend_by_command_releases_the_process_and_the_next_cell_resumes(jupyter, tmp_path: Path) -> None:
    k = Kernel(jupyter, JPY_SESSION_NAME="paper.ipynb")
    try:
        k.out("import numpy as np\nbig = np.arange(1 << 20, dtype=np.float64)\nview = big[10:20]\nx = 41")
        assert k.out("x + 1") == "42"  # Out[2]
        kernel_id = k.km.kernel_id
        pid = k.pid
        out, err, reply = k.run("%sojourn suspend")
        assert reply["status"] == "ok" and not err, err
        assert "suspended at capsule cap_" in out and "restored and checked" in out, out
        assert reply["execution_count"] == 3
        assert _wait_dead(pid), "the suspended kernel's process is still alive"
        stub = _stubbed(k)
        assert _rss_mib(stub) < 150, _rss_mib(stub)  # pyzmq + jupyter_client, not the kernel's memory
        # A front end reconnecting asks for kernel_info: the stand-in answers, nothing resumes.
        info = k.kc.kernel_info(reply=True, timeout=30)["content"]
        assert info["status"] == "ok" and info["language_info"]["name"] == "python"
        assert k.pid == stub
        # The next cell resumes: same kernel id, a new process, all the state, Out, the count.
        out, err, reply = k.run("print(x, Out[2], _2, view.base is big, float(big[-1]), _i2)")
        assert not err, err
        assert out.strip() == f"41 42 42 True {float((1 << 20) - 1)} x + 1", out
        assert reply["execution_count"] == 4
        assert k.km.kernel_id == kernel_id
        assert k.pid not in (pid, stub) and _wait_dead(stub)
        types = [(e["type"], e.get("reason"), e["capsule"].get("reason") if isinstance(e.get("capsule"), dict)
                  else None) for e in _events(tmp_path / "repo", "paper")]
        i = types.index(("stopped", "suspended", None))
        assert ("capsule", None, "suspend") in types[:i]
        assert [t[0] for t in types[i + 1:i + 3]] == ["authority", "allocation"], types
        assert k.out("x") == "41"
    finally:
        k.close()


def test_a_cell_queued_behind_suspend_resumes_the_kernel(jupyter) -> None:
    k = Kernel(jupyter)
    try:
        k.out("x = 5")
        first = k.kc.execute("%sojourn suspend")
        second = k.kc.execute("print('after', x * 2)")
        replies: dict[str, Any] = {}
        while len(replies) < 2:
            msg = k.kc.get_shell_msg(timeout=300)
            replies[msg["parent_header"]["msg_id"]] = msg["content"]
        assert replies[first]["status"] == "ok" and replies[second]["status"] == "ok", replies
        texts = []
        while True:
            msg = k.kc.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == second and msg["msg_type"] == "stream":
                texts.append(msg["content"]["text"])
            if (msg["parent_header"].get("msg_id") == second and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"):
                break
        assert "".join(texts) == "after 10\n"
        assert "sojourn.notebook.launcher" in _cmdline(k.pid)
    finally:
        k.close()


def test_idle_suspend_then_resume_and_a_fresh_kernel_resumes_the_workspace(jupyter, tmp_path: Path) -> None:
    k = Kernel(jupyter, SOJOURN_AUTOSUSPEND="2s", JPY_SESSION_NAME="idle.ipynb")
    k2 = None
    try:
        k.out("import random\nrandom.seed(1)\nvalues = {'a': [1, 2]}")
        pid = k.pid
        deadline = time.monotonic() + 120
        while "sojourn.notebook.stub" not in _cmdline(k.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _stubbed(k)
        assert _wait_dead(pid)
        k.wait_serving()  # nothing told this client the kernel suspended (no cell was waiting)
        assert k.out(f"print(values, random.random() == {__import__('random').Random(1).random()!r})") == \
            "{'a': [1, 2]} True"
        assert "autosuspend after 2 s idle" in k.out("%sojourn status")  # the setting went along
        # Shut down while suspended: the workspace stays suspended; a fresh kernel for the same
        # notebook (kernelspec resume="notebook") starts from it, and `%sojourn resume` works too.
        deadline = time.monotonic() + 120
        while "sojourn.notebook.stub" not in _cmdline(k.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _stubbed(k)
        k.close()
        k2 = Kernel(jupyter, SOJOURN_RESUME="notebook", JPY_SESSION_NAME="idle.ipynb")
        assert k2.out("values") == "{'a': [1, 2]}"
        k2.out("values['b'] = 3")
        assert "checkpoint cap_" in k2.out("%sojourn checkpoint")
        k2.close()
        k2 = Kernel(jupyter)
        text = k2.out("%sojourn resume idle")
        assert text.startswith("opened idle"), text
        assert k2.out("values") == "{'a': [1, 2], 'b': 3}"
    finally:
        k.close()
        if k2 is not None:
            k2.close()

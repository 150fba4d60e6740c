"""Forks (two branches from one point, both working, chunks stored once), failed moves that
leave the kernel where it was, and autosaves that fail without hurting the kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.notebook.kernels import Kernel

MIB = 1 << 20
FAILED = ("(lambda a: a.wait(120) and not a.pending and any(not r.ok for r in a.history))("
          "__import__('sojourn.notebook.magics', fromlist=['x']).controller(get_ipython()).autosave)")
OK_AGAIN = ("(lambda a: a.wait(120) and not a.pending and a.history[-1].ok)("
            "__import__('sojourn.notebook.magics', fromlist=['x']).controller(get_ipython()).autosave)")
WAIT = "__import__('sojourn.notebook.magics', fromlist=['x']).controller(get_ipython()).autosave.wait(120)"


def _chunk_bytes(repo: Path) -> int:
    return sum(p.stat().st_size for p in (repo / "chunks").rglob("*") if p.is_file())


def test_fork_two_branches_diverge_and_share_chunks(jupyter, tmp_path: Path) -> None:
    a = Kernel(jupyter)
    b = None
    try:
        a.out("import numpy as np\nbig = np.random.default_rng(0).random(4 << 20)  # 32 MiB\nx = 1\n"
              "class P:\n    pass\np = P()")
        text = a.out("%sojourn fork branch")
        assert "forked branch" in text, text
        after_fork = _chunk_bytes(tmp_path / "repo")
        b = Kernel(jupyter, SOJOURN_RESUME="branch")
        assert b.out("print(x, big.sum() == np.random.default_rng(0).random(4 << 20).sum(), type(p) is P)") == "1 True True"
        a.out("x = 10\nbig[:10] = -1")
        b.out("x = 20\nbig[-10:] = -2")
        assert "checkpoint cap_" in a.out("%sojourn checkpoint")
        assert "checkpoint cap_" in b.out("%sojourn checkpoint")
        assert a.out("print(x, big[0], big[-1] > 0)") == "10 -1.0 True"
        assert b.out("print(x, big[0] > 0, big[-1])") == "20 True -2.0"
        # One 32 MiB array stored once; each branch's change rewrote one 4 MiB chunk.
        total = _chunk_bytes(tmp_path / "repo")
        assert 32 * MIB <= after_fork < 34 * MIB, after_fork
        assert total - after_fork <= 2 * 4 * MIB + MIB, total - after_fork
        # The fork is its own workspace, held by kernel b, and says where it came from.
        from sojourn.ops import notebook as nb
        from sojourn.repository.repo import open_repository
        from sojourn.workspace.store import WorkspaceStore

        with open_repository(str(tmp_path / "repo")) as r:
            store = WorkspaceStore(r)
            ws = store.resolve("branch")
            rec = store.record(ws)
            assert rec.state == "running" and rec.current is not None
            events = store.events(ws)
            assert any(e.get("forked_from") for e in events)
            caps = [e["capsule"]["reason"] for e in events if e["type"] == "capsule"]
            assert caps[0] == "fork" and "checkpoint" in caps
        assert nb.last_capsule(str(tmp_path / "repo"), "branch")[1] is not None
    finally:
        a.close()
        if b is not None:
            b.close()


def test_failed_moves_leave_the_kernel_where_it_was(jupyter) -> None:
    k = Kernel(jupyter)
    try:
        k.out("import random\nrandom.seed(3)\nvalues = [1, 2, 3]")
        pid = k.pid
        out, err, _ = k.run("%sojourn move --to nowhere")
        assert "unknown machine 'nowhere'" in err
        out, err, _ = k.run("%sojourn move --to /bin/false")  # the destination dies at start
        assert "failed; this kernel stays where it was" in err and "exited at start" in err, err
        assert k.pid == pid
        # A capture slower than the destination's death (what a loaded machine does to any
        # capture): the provisioner has answered "failed" and closed the channel before the
        # source sends its capsule. The reason must still reach the cell, not a broken pipe.
        k.out("import time\nclass Slow:\n    def __reduce__(self):\n        time.sleep(1.0)\n"
              "        return (Slow, ())\nslow = Slow()")
        out, err, _ = k.run("%sojourn move --to /bin/false")
        assert "failed; this kernel stays where it was" in err and "exited at start" in err, err
        assert k.pid == pid
        k.out("del slow, Slow")
        assert k.out("print(values, random.random())") == f"[1, 2, 3] {__import__('random').Random(3).random()}"
        out, err, _ = k.run("%sojourn move --to local")
        assert "moved to local" in out and k.pid != pid
        assert k.out("values") == "[1, 2, 3]"
    finally:
        k.close()


def test_failing_autosave_says_why_and_the_kernel_goes_on(jupyter) -> None:
    k = Kernel(jupyter, SOJOURN_AUTOSAVE="1")
    try:
        k.out("a = 1")
        k.run("import socket\ns = socket.socket()")
        # Saves run one at a time and coalesce; wait (silently: a front end's own request is
        # not saved) until the one with the socket has ended.
        err1 = ""
        for _ in range(60):
            out, e, _ = k.run(FAILED, store_history=False)
            err1 += e
            if out.strip() == "True":
                break
        _, err2, reply = k.run("b = 2")
        err = err1 + err2
        assert reply["status"] == "ok"
        assert "autosave after cell 2 failed" in err and "s (socket.socket)" in err, err
        assert err.count("autosave after cell") == 1, err  # said once, not after every cell
        k.out("s.close()\ndel s")
        k.out("c = 3")
        ok_again = "False"
        for _ in range(60):  # the save after `del s` may be coalesced with later cells
            ok_again = k.run(OK_AGAIN, store_history=False)[0].strip()
            if ok_again == "True":
                break
        assert ok_again == "True"
        assert k.out("print(a, b, c)") == "1 2 3"
    finally:
        k.close()


@pytest.mark.slow
def test_a_move_the_kernel_gives_up_leaves_it_where_it_was(jupyter) -> None:
    """The kernel stops waiting (its time limit; Ctrl-C is the same) while the destination is
    still restoring: the destination is killed at once, and when it would have been ready
    nothing swaps, so the kernel is neither replaced nor killed."""
    import time

    k = Kernel(jupyter, SOJOURN_MOVE_TIMEOUT="2")
    try:
        # Restoring `slow` takes 6 s: longer than the kernel waits.
        k.out("import time\ndef slow_make():\n    time.sleep(6)\n    return Slow()\n"
              "class Slow:\n    def __reduce__(self):\n        return (slow_make, ())\nslow = Slow()\nvalues = [4, 5]")
        pid = k.pid
        out, err, _ = k.run("%sojourn move --to local")
        assert "failed; this kernel stays where it was" in err and "did not answer within 2 s" in err, out + err
        prov = k.km.provisioner
        deadline = time.monotonic() + 5
        while prov._pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not prov._pending, "the destination of the move the kernel gave up still runs"
        time.sleep(6)  # past the moment the destination would have been ready
        assert k.pid == pid
        assert k.out("print(values, type(slow).__name__)") == "[4, 5] Slow"
    finally:
        k.close()

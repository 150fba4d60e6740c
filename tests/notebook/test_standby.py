"""Warm standby kernels: a launch claims a process that has already imported ipykernel,
sojourn's restore path and the configured libraries; it becomes that launch's kernel (fresh
or resumed from a capsule) with the launch's environment and directory; a replacement takes
its place; nothing is left behind; a standby that does not match a launch is not used."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.notebook.conftest import _alive
from tests.notebook.kernels import Kernel

# A stdlib module that neither ipykernel nor sojourn imports: in sys.modules only if preloaded.
LIB = "colorsys"
WARM = {"SOJOURN_STANDBY": "1", "SOJOURN_STANDBY_PRELOAD": LIB}


@pytest.fixture
def pool(jupyter) -> Iterator[Any]:
    from sojourn.notebook import standby

    p = standby.pool()
    yield p
    p.close()  # a failed test's standbys too


def _launcher_children() -> list[int]:
    """This process's children that run the sojourn launcher (kernels and standbys)."""
    me = str(os.getpid())
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z" and b"sojourn.notebook.launcher" in cmd:
            out.append(int(d))
    return out


def _wait_gone(pids: list[int], seconds: float = 20) -> list[int]:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_launches_claim_warm_standbys_fresh_and_resumed(jupyter, pool, tmp_path: Path) -> None:
    kernels: list[Kernel] = []
    try:
        cold = Kernel(jupyter, **WARM)
        kernels.append(cold)
        assert cold.out(f"import sys; print({LIB!r} in sys.modules)") == "False"
        first = pool.wait_ready()
        assert first.proc.pid != cold.pid

        t0 = time.perf_counter()
        k = Kernel(jupyter, **WARM, JPY_SESSION_NAME="warm.ipynb", SOJOURN_WORKSPACE_NAME="warmws")
        kernels.append(k)
        launch_s = time.perf_counter() - t0
        assert k.pid == first.proc.pid, "the launch did not claim the standby"
        # Preloaded before any cell; the launch's environment and directory are the kernel's.
        assert k.out(f"import sys, os; print({LIB!r} in sys.modules, os.environ['JPY_SESSION_NAME'], "
                     "os.getcwd(), sys.path[0] == os.getcwd())") == f"True warm.ipynb {os.getcwd()} True"
        assert k.out("import os; print(os.environ.get('SOJOURN_STANDBY_FD'), os.environ.get('SOJOURN_KERNEL_CONTROL') "
                     "is not None)") == "None True"
        status = k.out("%sojourn status")
        assert "warm standby that the launch claimed" in status and "claimed +" in status, status
        assert "warmws" in status, status
        # Cells behave as in any kernel: state, errors, output, history.
        assert k.out("x = 20\nx + 1") == "21"
        _, err, reply = k.run("1 / 0")
        assert reply["status"] == "error" and "ZeroDivisionError" in err
        assert k.out("print(x * 2, _)") == "40 21"
        msg_id = k.kc.execute("import time\nfor _ in range(600): time.sleep(0.1)")
        time.sleep(1.0)
        k.km.interrupt_kernel()
        while (reply := k.kc.get_shell_msg(timeout=30))["parent_header"].get("msg_id") != msg_id:
            pass
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]

        # A replacement takes the claimed one's place.
        second = pool.wait_ready({first.proc.pid, cold.pid})

        k.out("import numpy as np\nbig = np.arange(1 << 18, dtype=np.float64)\nview = big[10:20]\n"
              "class P:\n    pass\np = P()\np.ref = big\ny = {'a': [1, 2]}")
        assert "checkpoint cap_" in k.out("%sojourn checkpoint")
        cap = k.out("print(__import__('sojourn.notebook.magics', fromlist=['x']).controller(get_ipython()).autosave.head)")
        k.close()
        assert _wait_gone([first.proc.pid]) == []

        r = Kernel(jupyter, **WARM, SOJOURN_RESUME=cap)
        kernels.append(r)
        assert r.pid == second.proc.pid, "the resumed kernel did not claim the standby"
        assert r.out("print(x, y, view.base is big, type(p) is P, p.ref is big, float(big.sum()) == "
                     "float(np.arange(1 << 18, dtype=np.float64).sum()), view[:2].tolist())") == \
            "20 {'a': [1, 2]} True True True True [10.0, 11.0]"
        assert r.out("big[10] = -1\nprint(view[0])") == "-1.0"
        status = r.out("%sojourn status")
        assert "warm standby" in status and "restored +" in status, status
        print(f"claimed fresh launch: {launch_s:.2f} s to ready")
    finally:
        for k in kernels:
            k.close()
    # The last kernel of the key is gone: so are its standbys (the replacement of the resumed one).
    assert _wait_gone(_launcher_children()) == []
    assert pool.idle() == []


def test_a_standby_that_does_not_match_is_not_claimed(jupyter, pool, tmp_path: Path) -> None:
    from sojourn.notebook.kernelspec import write

    # Another python for the pool: the same interpreter through another path.
    other = str(Path(sys.executable).with_name("python3"))
    assert os.path.exists(other) and other != sys.executable
    write(tmp_path / "jupyter" / "kernels" / "sojourn-other", python=other)
    kernels: list[Kernel] = []
    try:
        kernels.append(Kernel(jupyter, **WARM))
        s = pool.wait_ready()
        for kw in ({"SOJOURN_MEMORY": str(8 << 30)}, {"kernel": "sojourn-other"},
                   {"SOJOURN_STANDBY_PRELOAD": "wave"}, {"OMP_NUM_THREADS": "1"}):
            # (their own pools are not filled during the test: it only adds load)
            k = Kernel(jupyter, **{**WARM, "SOJOURN_STANDBY_DELAY": "3600", **kw})
            kernels.append(k)
            assert k.pid != s.proc.pid, f"claimed by a launch with {kw}"
            assert k.out(f"import sys; print({LIB!r} in sys.modules)") == "False", kw
            assert s.proc.poll() is None and s in pool.idle()
        # A directory holding a module named like a preloaded library: the launch would import
        # the user's module, so it does not get the standby's library.
        (tmp_path / f"{LIB}.py").write_text("MINE = True\n")
        k = Kernel(jupyter, **WARM, SOJOURN_STANDBY_DELAY="3600")
        kernels.append(k)
        assert k.pid != s.proc.pid
        assert k.out(f"import {LIB}; print({LIB}.MINE)") == "True"
        # The matching launch still gets it, here configured by its kernelspec, not its env.
        (tmp_path / f"{LIB}.py").unlink()
        write(tmp_path / "jupyter" / "kernels" / "sojourn-warm", standby=1, standby_preload=[LIB])
        k = Kernel(jupyter, kernel="sojourn-warm")
        kernels.append(k)
        assert k.pid == s.proc.pid
    finally:
        for k in kernels:
            k.close()
    assert _wait_gone(_launcher_children()) == []


def test_without_a_preload_list_standbys_learn_what_the_last_kernel_imported(jupyter, pool) -> None:
    kernels: list[Kernel] = []
    try:
        a = Kernel(jupyter, SOJOURN_STANDBY="1")
        kernels.append(a)
        assert a.out("import sys; print('tqdm' in sys.modules)") == "False"
        a.out("import tqdm")
        end = time.monotonic() + 120
        while not any(s.ready.is_set() and "tqdm" in s.preload for s in pool.idle()):
            assert time.monotonic() < end, [(s.preload, s.ready.is_set()) for s in pool.idle()]
            time.sleep(0.05)
        s = next(s for s in pool.idle() if "tqdm" in s.preload)
        b = Kernel(jupyter, SOJOURN_STANDBY="1")
        kernels.append(b)
        assert b.pid == s.proc.pid
        assert b.out("import sys; print('tqdm' in sys.modules)") == "True"
    finally:
        for k in kernels:
            k.close()
    assert _wait_gone(_launcher_children()) == []


def test_a_restarted_kernel_is_a_standby_and_the_pool_outlives_the_restart(jupyter, pool) -> None:
    k = Kernel(jupyter, **WARM)
    try:
        k.out("x = 1")
        s = pool.wait_ready()
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=120)
        assert k.pid == s.proc.pid
        assert k.out("print('x' in dir())") == "False"
        assert pool.wait_ready({s.proc.pid}).proc.poll() is None  # still this key's pool
    finally:
        k.close()
    assert _wait_gone(_launcher_children()) == []


def test_a_move_destination_is_a_standby(jupyter, pool) -> None:
    k = Kernel(jupyter, **WARM)
    try:
        k.out("import numpy as np\nbig = np.arange(1000.0)\nview = big[5:]\nn = 7")
        s = pool.wait_ready()
        out, err, _ = k.run("%sojourn move --to local")
        assert "moved to local" in out and "warm standby that the launch claimed" in out, out + err
        assert k.pid == s.proc.pid
        assert k.out("print(n, view.base is big, view[0])") == "7 True 5.0"
    finally:
        k.close()
    assert _wait_gone(_launcher_children()) == []


def test_a_resumed_capsule_names_the_libraries_its_standby_preloads(tmp_path: Path) -> None:
    import numpy as np

    import sojourn
    from sojourn.notebook import standby

    repo = str(tmp_path / "repo")
    ref = sojourn.capture({"a": np.zeros(3), "n": 1}, repo)
    assert "numpy" in standby.capsule_libraries(repo, ref.id, None)
    assert standby.capsule_libraries(repo, "no-such-workspace", None) == []


def test_a_suspended_kernel_resumes_on_a_standby(jupyter, pool) -> None:
    k = Kernel(jupyter, **WARM, JPY_SESSION_NAME="nap.ipynb")
    try:
        k.out("import numpy as np\nbig = np.arange(100.0)\nview = big[3:]\nx = 5")
        s = pool.wait_ready()
        out, err, reply = k.run("%sojourn suspend")
        assert reply["status"] == "ok" and "suspended at capsule" in out, out + err
        assert k.out("print(x, view.base is big, view[0])") == "5 True 3.0"  # this cell wakes it
        assert k.pid == s.proc.pid
    finally:
        k.close()
    assert _wait_gone(_launcher_children()) == []


STANDBY_ORPHAN = r"""
import os, sys, time
from sojourn.notebook import standby
pool = standby.pool()
env = {k: v for k, v in os.environ.items() if k not in standby.PER_LAUNCH and not k.startswith("JPY_")}
key = standby.Key(sys.executable, "", "local", ("colorsys",), standby.env_key(env))
pool.use(key, 1, 1, {"env": env, "popen": {}})
pool.fill(key)
end = time.monotonic() + 120
while not any(s.ready.is_set() for s in pool.idle(key)) and time.monotonic() < end:
    time.sleep(0.05)
print(pool.idle(key)[0].proc.pid, flush=True)
time.sleep(600)
"""


def test_a_standby_whose_parent_dies_exits(tmp_path: Path) -> None:
    from tests.conftest import SRC

    env = {**os.environ, "PYTHONPATH": str(SRC)}
    parent = subprocess.Popen([sys.executable, "-c", STANDBY_ORPHAN], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=tmp_path)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert _alive(pid)
    finally:
        parent.send_signal(signal.SIGKILL)  # no atexit, no cleanup: only the channel closes
        parent.wait()
    assert _wait_gone([pid]) == [], "the standby outlived its parent"

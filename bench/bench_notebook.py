"""Notebook benchmark: one kernel, a 1 GiB namespace, six small-change cells; sojourn's
autosave (fork), an in-kernel capture (the alternative), dill's dump_session/load_session;
restore into a fresh process; a move between local machines; re-running all cells.

    .venv/bin/python bench/bench_notebook.py [--gib 1.0] [--load N] [--json OUT]
        [--skip-main] [--skip-dill] [--skip-heavy] [--skip-kishu]

Everything runs on real sojourn kernels started by jupyter_client with the sojourn
provisioner, in a temporary repository. Prints one side-by-side table from one run.

How "re-running" and "restoring" are measured (the same way on both sides):

* re-run: the notebook's cells run one after the other in a kernel that has started and
  answered (the kernel's start is not counted); the clock runs from the first cell's request
  to the last cell's reply, so it includes importing the notebook's libraries (its first cell);
* restore: ``sojourn.restore`` in a fresh interpreter, the clock from the call (after
  ``import sojourn``, 30 ms) to its return: reading and checking the chunks, unpickling,
  the fingerprint check, and importing the same libraries (the unpickler imports them).
  Neither side counts an interpreter's or a kernel's start;
* "resumed kernel" is a fresh sojourn kernel with ``SOJOURN_RESUME``, from its start to its
  first cell's reply: it counts a kernel start that the re-run side does not;
* warm: both sides on kernels claimed from a standby pool that preloaded the notebook's
  libraries, both clocks from the launch request (``bench_warm``);
* the import split: a second fresh interpreter imports the top-level modules that the
  restore imported (timed), then restores (timed). That import time is the floor of any
  restore in a fresh process and is part of the re-run too: the last columns subtract it
  from both sides.

``--load N`` runs N busy loops (``while 1: pass``) during the move, to see it on a loaded
machine; the load average is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

SETUP = """
import numpy as np
rng = np.random.default_rng(0)
arrays = [rng.random({n}) for _ in range(4)]
class Holder:
    def __init__(self, a):
        self.a = a
h = Holder(arrays[0])
view = arrays[1][:1000]
counter = 0
"""
CELLS = [
    "counter = 1",
    "counter += 1",
    "arrays[2][: len(arrays[2]) // 100] += 1.0",  # 1% of one array, contiguous
    "label = 'x' * 10",
    "arrays[3][5_000_000 : 5_000_000 + len(arrays[3]) // 100] *= 2",  # another 1%
    "counter += 1",
]
# The controller, reached without binding a name in the user's namespace (it would be captured).
CTL = "__import__('sojourn.notebook.magics', fromlist=['x']).controller(get_ipython())"


class Kernel:
    def __init__(self, env: dict[str, str]):
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="sojourn")
        self.km.start_kernel(env={**os.environ, **env})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, store_history: bool = True) -> tuple[float, str]:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            c = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(c["text"])
            elif msg["msg_type"] == "error":
                out.append(f"ERROR {c['ename']}: {c['evalue']}")
            elif msg["msg_type"] == "execute_result":
                out.append(c["data"].get("text/plain", ""))

        t0 = time.perf_counter()
        self.kc.execute_interactive(code, store_history=store_history, timeout=900, output_hook=hook)
        text = "".join(out)
        if "ERROR" in text:
            raise RuntimeError(f"{code!r} failed: {text}")
        return time.perf_counter() - t0, text

    def value(self, code: str) -> Any:
        _, text = self.run(f"import json as _j; print('@@' + _j.dumps({code}))", store_history=False)
        return json.loads(text.split("@@", 1)[1])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def setup_env(tmp: Path) -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    from sojourn.notebook.kernelspec import write

    write(tmp / "jupyter" / "kernels" / "sojourn")
    env = {"JUPYTER_PATH": str(tmp / "jupyter"), "IPYTHONDIR": str(tmp / "ipython"),
           "SOJOURN_REPO": str(tmp / "repo"), "SOJOURN_HOME": str(tmp / "home")}
    os.environ.update(env)
    KernelProvisionerFactory.instance().provisioners.setdefault("sojourn-provisioner", EntryPoint(
        name="sojourn-provisioner", value="sojourn.notebook.provisioner:SojournProvisioner",
        group="jupyter_client.kernel_provisioners"))
    return env


def bench_rerun(n: int) -> float:
    k = Kernel({})
    try:
        t0 = time.perf_counter()
        k.run(SETUP.format(n=n))
        for c in CELLS:
            k.run(c)
        return time.perf_counter() - t0
    finally:
        k.close()


def bench_sojourn(n: int, load: int = 0, move_env: dict[str, str] | None = None) -> dict[str, Any]:
    k = Kernel({"SOJOURN_AUTOSAVE": "1", **(move_env or {})})
    res: dict[str, Any] = {}
    try:
        k.run(SETUP.format(n=n))
        k.run(f"{CTL}.autosave.wait(600)", store_history=False)
        cell_wall = []
        for c in CELLS:
            t, _ = k.run(c)
            cell_wall.append(t)
            k.run(f"{CTL}.autosave.wait(600)", store_history=False)  # one cell's save measured at a time
        hist = k.value("[dict(cell=r.cell, ok=r.ok, blocking=r.blocking, written=r.bytes_written, "
                       "seconds=r.seconds, capsule=r.capsule, error=r.error) for r in {CTL}.autosave.history]".replace("{CTL}", CTL))
        res["autosave"] = hist
        res["cell_wall"] = cell_wall
        # the alternative: capture in the kernel's own thread, blocking the next cell
        sync = []
        for c in ("counter += 1", "arrays[2][: len(arrays[2]) // 100] += 1.0"):
            k.run(f"{CTL}.autosave.enabled = False", store_history=False)
            k.run(c)
            t, text = k.run("%sojourn checkpoint")
            sync.append({"cell": c, "seconds": t, "text": text.strip()})
        res["sync"] = sync
        k.run(f"{CTL}.autosave.enabled = True", store_history=False)
        res["last_capsule"] = k.value(f"{CTL}.autosave.head")
        # move: from the command to the next cell's end
        pid0 = getattr(k.km.provisioner, "pid", None)
        hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(load)]
        try:
            if hogs:
                time.sleep(1.0)
            loadavg = os.getloadavg()
            t0 = time.perf_counter()
            _, text = k.run("%sojourn move --to local")
            t_move = time.perf_counter() - t0
            _, after = k.run("print(counter, view.base is arrays[1], type(h) is Holder, float(arrays[2][0] - arrays[2][-1]) > 0)")
            t_next = time.perf_counter() - t0
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        res["move"] = {"move_s": t_move, "next_cell_done_s": t_next, "text": text.strip(), "busy_loops": load,
                       "loadavg": loadavg, "pid": [pid0, getattr(k.km.provisioner, "pid", None)], "after": after.strip()}
    finally:
        k.close()
    return res


RESTORE = """
import json, sys, time
t0 = time.perf_counter()
import sojourn
ns = {}
r = sojourn.restore(sys.argv[1], sys.argv[2], into=ns)
t = time.perf_counter() - t0
print(json.dumps({"seconds": t, "timings": r.timings, "views": ns["view"].base is ns["arrays"][1],
                  "class": type(ns["h"]) is ns["Holder"], "h_is_arrays0": ns["h"].a is ns["arrays"][0]}))
"""


def bench_restore(capsule: str, repo: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", RESTORE, capsule, repo], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_resume_kernel(capsule: str) -> float:
    t0 = time.perf_counter()
    k = Kernel({"SOJOURN_RESUME": capsule})
    try:
        k.run("counter")
        return time.perf_counter() - t0
    finally:
        k.close()


def bench_dill(n: int, tmp: Path) -> dict[str, Any]:
    k = Kernel({})
    path = tmp / "session.pkl"
    try:
        k.run(SETUP.format(n=n))
        k.run("import dill")
        dumps = []
        for c in CELLS[:3]:
            k.run(c)
            t, _ = k.run(f"dill.dump_session({str(path)!r})", store_history=False)
            dumps.append({"seconds": t, "bytes": path.stat().st_size})
    finally:
        k.close()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import dill; dill.load_session({str(path)!r})"], check=True)
    return {"dumps": dumps, "load_s": time.perf_counter() - t0}


# Notebooks whose cells do real work: re-running them is what a restore replaces.
HEAVY: dict[str, list[str]] = {
    "analysis (pandas+sklearn)": [
        "import numpy as np, pandas as pd\nfrom sklearn.ensemble import RandomForestClassifier\n"
        "from sklearn.linear_model import LogisticRegression\nfrom sklearn.model_selection import train_test_split\n"
        "rng = np.random.default_rng(0)",
        "df = pd.DataFrame(rng.normal(size=(400_000, 8)), columns=list('abcdefgh'))\n"
        "df['k'] = rng.integers(0, 50, len(df))\ndf['y'] = (df.a + 0.5 * df.b - df.c * df.d + rng.normal(size=len(df)) > 0).astype(int)",
        "summary = df.groupby('k').agg(['mean', 'std', 'median'])\nroll = df[list('abcd')].rolling(500).mean()",
        "Xtr, Xte, ytr, yte = train_test_split(df[list('abcdefgh')], df.y, random_state=1)\n"
        "lr = LogisticRegression(max_iter=500).fit(Xtr, ytr)",
        "rf = RandomForestClassifier(n_estimators=40, max_depth=10, n_jobs=1, random_state=0).fit(Xtr[:100_000], ytr[:100_000])\n"
        "score = rf.score(Xte, yte)",
    ],
    "training (torch DataLoader)": [
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\ntorch.manual_seed(0)\ntorch.set_num_threads(1)",
        "X = torch.randn(40_000, 64)\nY = (X[:, :8].sum(1, keepdim=True) > 0).float()\n"
        "loader = DataLoader(TensorDataset(X, Y), batch_size=128, shuffle=True)",
        "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), "
        "torch.nn.Linear(256, 1))\nopt = torch.optim.Adam(model.parameters(), lr=1e-3)\nlosses = []",
        "for _ in range(6):\n    for xb, yb in loader:\n        opt.zero_grad()\n"
        "        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)\n        loss.backward()\n"
        "        opt.step()\n    losses.append(loss.item())\n"
        # A tensor still in an autograd graph cannot travel (sojourn refuses it, with its path):
        # the last loss is kept as a plain value, as a notebook that checkpoints would.
        "loss = loss.detach()",
    ],
}


def heavy_arrays(n: int) -> list[str]:
    """The 4-array notebook, with cells that compute (matrix products, a least-squares fit)."""
    return [SETUP.format(n=n),
            "g = arrays[0][: 2048 * 2048].reshape(2048, 2048)\nprod = g @ g.T",
            "A = arrays[1][: 200_000 * 64].reshape(200_000, 64)\nb = arrays[2][:200_000]\n"
            "coef, *_ = np.linalg.lstsq(A, b, rcond=None)",
            "arrays[3] = np.sqrt(arrays[3]) * np.log1p(arrays[2])\nstats = [float(a.mean()) for a in arrays]",
            "u, s_, vt = np.linalg.svd(prod[:1024, :1024])"]


def bench_rerun_vs_restore(cells: list[str]) -> dict[str, Any]:
    """One kernel runs the cells (timed: that is what a re-run costs) and checkpoints; a fresh
    kernel resumes the capsule (timed from its start to its first cell's end) and a fresh
    process restores it (``sojourn.restore``)."""
    k = Kernel({})
    try:
        per_cell = []
        t0 = time.perf_counter()
        for c in cells:
            per_cell.append(k.run(c)[0])
        rerun = time.perf_counter() - t0
        _, said = k.run("%sojourn checkpoint")
        cap = k.value(f"{CTL}.autosave.head")
    finally:
        k.close()
    if not cap:
        raise RuntimeError(f"the checkpoint after the cells failed, nothing to restore: {said.strip()}")
    t0 = time.perf_counter()
    k = Kernel({"SOJOURN_RESUME": cap})
    try:
        k.run("1")
        resume = time.perf_counter() - t0
    finally:
        k.close()
    repo = os.environ["SOJOURN_REPO"]
    cold = _run_json(COLD_RESTORE, cap, repo)
    split = _run_json(SPLIT_RESTORE, cap, repo, ",".join(cold["imported"]))
    libs = [m for m in cold["imported"] if m not in sys.stdlib_module_names]
    return {"rerun_s": rerun, "rerun_cells_s": per_cell, "resume_kernel_s": resume, "restore_s": cold["seconds"],
            "restore_timings": cold["timings"], "imported": cold["imported"], "import_s": split["import_s"],
            "restore_after_import_s": split["restore_s"], "split_timings": split["timings"],
            "warm": bench_warm(cells, cap, libs)}


def bench_warm(cells: list[str], cap: str, libs: list[str]) -> dict[str, Any]:
    """Both sides on warm standby kernels (docs/notebooks.md, "Warm standby kernels") that
    preloaded the notebook's libraries, each clock from the launch request: the re-run to its
    last cell's reply, the resumed kernel to its first cell's reply. A first kernel starts
    cold and fills the pool; the resume claims a standby; its replacement (started 1 s after
    that launch) is claimed by the re-run, whose own replacement is held back until the
    cells are done (``SOJOURN_STANDBY_DELAY``), so no standby's imports compete with them."""
    from sojourn.notebook import standby

    env = {"SOJOURN_STANDBY": "1", "SOJOURN_STANDBY_PRELOAD": ",".join(libs)}
    pool = standby.pool()
    seed = Kernel(env)
    try:
        s = pool.wait_ready(timeout=300)
        t0 = time.perf_counter()
        k = Kernel({**env, "SOJOURN_RESUME": cap})
        try:
            k.run("1")
            resume = time.perf_counter() - t0
            claimed = [getattr(k.km.provisioner, "pid", None) == s.proc.pid]
            note = k.value(f"[n for n in {CTL}.notes if 'standby' in n]")
        finally:
            k.close()
        s = pool.wait_ready({s.proc.pid}, timeout=300)
        t0 = time.perf_counter()
        k = Kernel({**env, "SOJOURN_STANDBY_DELAY": "3600"})
        try:
            for c in cells:
                k.run(c)
            rerun = time.perf_counter() - t0
            claimed.append(getattr(k.km.provisioner, "pid", None) == s.proc.pid)
        finally:
            k.close()
    finally:
        seed.close()
    if not all(claimed):
        raise RuntimeError(f"a warm launch did not claim its standby (resume, re-run: {claimed})")
    return {"rerun_s": rerun, "resume_kernel_s": resume, "preload": libs, "resume_note": note}


# A cold restore, and the top-level modules it imported (the notebook's libraries).
COLD_RESTORE = """
import json, sys, time
import sojourn
before = set(sys.modules)
t = time.perf_counter()
r = sojourn.restore(sys.argv[1], sys.argv[2], into={})
t = time.perf_counter() - t
new = sorted({m.split(".")[0] for m in set(sys.modules) - before} - {m.split(".")[0] for m in before})
print(json.dumps({"seconds": t, "timings": r.timings, "imported": [m for m in new if not m.startswith("_")]}))
"""
# The same restore with those modules imported first: the import is the floor of a restore
# into a fresh process, the rest is sojourn's own work.
SPLIT_RESTORE = """
import importlib, json, sys, time
import sojourn
t = time.perf_counter()
for name in filter(None, sys.argv[3].split(",")):
    try:
        importlib.import_module(name)
    except Exception:
        pass
t_imp = time.perf_counter() - t
t = time.perf_counter()
r = sojourn.restore(sys.argv[1], sys.argv[2], into={})
print(json.dumps({"import_s": t_imp, "restore_s": time.perf_counter() - t, "timings": r.timings}))
"""


def _run_json(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the restore process failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


PEERS = Path(__file__).resolve().parents[1] / ".venv-peers"


def bench_kishu(n: int, tmp: Path) -> dict[str, Any]:
    """Kishu 0.3.4 on the same notebook, in its own kernel from .venv-peers: per-cell wall time
    (it commits after every cell, in the kernel's thread), bytes its store grows per cell,
    checkout into a fresh kernel."""
    from jupyter_client.manager import KernelManager

    py = PEERS / "bin" / "python"
    spec = tmp / "jupyter" / "kernels" / "kishu-peer"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [str(py), "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"], "display_name": "kishu",
                                                  "language": "python"}))
    root = tmp / "kishu"
    (root / ".kishu").mkdir(parents=True, exist_ok=True)
    (root / ".kishu" / "config.ini").write_text("[JUPYTERINT]\ntest_mode = True\n")
    nb_path = tmp / "kishu.ipynb"
    import nbformat

    nbformat.write(nbformat.v4.new_notebook(), nb_path)
    # TEST_NOTEBOOK_PATH: Kishu finds its kernel id from a Jupyter server, which this bench has not
    env = {"KISHU_PATH_ROOT": str(root), "TEST_NOTEBOOK_PATH": str(nb_path)}

    def store_bytes() -> int:
        # Kishu 0.3.4 keeps its commits in a sqlite file next to the notebook
        # (kishu/storage/path.py: <notebook dir>/<stem>.kishudb), only its config under
        # $KISHU_PATH_ROOT/.kishu: both, with sqlite's journal or WAL files.
        files = [*(root / ".kishu").rglob("*"), *nb_path.parent.glob(f"{nb_path.stem}.kishudb*")]
        return sum(p.stat().st_size for p in files if p.is_file())

    class Peer(Kernel):
        def __init__(self) -> None:
            self.km = KernelManager(kernel_name="kishu-peer")
            self.km.start_kernel(env={**os.environ, **env})
            self.kc = self.km.client()
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=120)

    def attach(k: Kernel) -> None:
        try:
            k.run(f"from kishu import init_kishu; init_kishu({str(nb_path)!r})")
        except RuntimeError as e:  # Kishu's post-cell hook runs for the cell that installed it
            if "PostWithoutPreError" not in str(e):
                raise

    k = Peer()
    res: dict[str, Any] = {}
    try:
        attach(k)
        k.run(SETUP.format(n=n))
        cells = []
        for c in CELLS:
            before = store_bytes()
            t, _ = k.run(c)
            cells.append({"cell": c, "seconds": t, "written": store_bytes() - before})
        if not any(nb_path.parent.glob(f"{nb_path.stem}.kishudb*")):  # not where 0.3.4 keeps it: say so
            for cell in cells:
                cell["written"] = None
        res["cells"] = cells
    finally:
        k.close()
    res.update(_kishu_store(nb_path))
    log = subprocess.run([str(PEERS / "bin" / "kishu"), "log", str(nb_path)], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)
    res["log"] = log.stdout[-600:] + log.stderr[-300:]
    ids = re.findall(r"commit_id=['\"]([0-9a-f]+)['\"]", log.stdout)
    if not ids:
        raise RuntimeError(f"no commit in `kishu log`: {res['log']!r}")
    head = res["head"] = ids[-1]
    k = Peer()
    try:
        attach(k)
        t, text = k.run(f"_kishu.checkout({head!r})")
        # The first lines are Kishu's own PostWithoutPreError from the cell that attached it.
        res["checkout_s"], res["checkout_text"] = t, text.strip().splitlines()[-1][:200] if text.strip() else ""
    finally:
        k.close()
    return res


def _kishu_store(nb_path: Path) -> dict[str, Any]:
    """What Kishu's sqlite store holds: variable data bytes, and the co-variables it rates as
    unserializable (size inf: it stores nothing of them and re-runs their cells at checkout)."""
    import sqlite3

    db = nb_path.parent / f"{nb_path.stem}.kishudb"
    if not db.exists():
        return {}
    con = sqlite3.connect(db)
    try:
        data = sum(con.execute(f"SELECT COALESCE(SUM(LENGTH(data)), 0) FROM {t}").fetchone()[0]
                   for t in ("variable_snapshot", "checkpoint"))
        inf = sorted({name.split(",", 1)[1] for name, size in
                      con.execute("SELECT versioned_name, size FROM ahg_variable_snapshot") if size == float("inf")})
    finally:
        con.close()
    return {"stored_bytes": data, "db_bytes": db.stat().st_size, "recomputed": inf}


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="total size of the 4 arrays")
    ap.add_argument("--json")
    ap.add_argument("--skip-dill", action="store_true")
    ap.add_argument("--skip-heavy", action="store_true", help="skip re-run vs restore on computing notebooks")
    ap.add_argument("--skip-kishu", action="store_true")
    ap.add_argument("--skip-main", action="store_true", help="only the re-run vs restore notebooks (and Kishu)")
    ap.add_argument("--load", type=int, default=0, help="busy loops running during the move (a loaded machine)")
    ap.add_argument("--no-prefetch", action="store_true", help="the move's destination reads the whole capsule "
                    "after the capture (SOJOURN_MOVE_PREFETCH=0), as before the prefetch")
    ap.add_argument("--hugepages", action="store_true", help="restored arrays get numpy's huge-page advice "
                    "(SOJOURN_RESTORE_HUGEPAGES=1), as before")
    args = ap.parse_args()
    n = int(args.gib * 2**30 / 4 / 8)
    with tempfile.TemporaryDirectory(prefix="sojourn-bench-nb-") as t:
        tmp = Path(t)
        env = setup_env(tmp)
        main_part: dict[str, Any] | None = None
        if not args.skip_main:
            rerun = bench_rerun(n)
            move_env = {**({"SOJOURN_MOVE_PREFETCH": "0"} if args.no_prefetch else {}),
                        **({"SOJOURN_RESTORE_HUGEPAGES": "1"} if args.hugepages else {})}
            soj = bench_sojourn(n, args.load, move_env)
            main_part = {"rerun": rerun, "sojourn": soj, "restore": bench_restore(soj["last_capsule"], env["SOJOURN_REPO"]),
                         "resume": bench_resume_kernel(soj["last_capsule"]),
                         "dill": None if args.skip_dill else bench_dill(n, tmp)}
        heavy: dict[str, Any] = {}
        if not args.skip_heavy:
            for name, cells in [*HEAVY.items(), (f"4 arrays ({args.gib:.2f} GiB), computing", heavy_arrays(n))]:
                heavy[name] = bench_rerun_vs_restore(cells)
        kishu: dict[str, Any] | str
        if args.skip_kishu:
            kishu = "skipped (--skip-kishu)"
        elif not (PEERS / "bin" / "python").exists():
            kishu = f"skipped: {PEERS} is absent (a venv with kishu==0.3.4 and ipykernel)"
        else:
            try:
                kishu = bench_kishu(n, tmp)
            except Exception as e:
                kishu = f"failed: {type(e).__name__}: {e}"
    if main_part is not None:
        print_main(args, main_part)
    if heavy:
        print_heavy(heavy)
    if isinstance(kishu, str):
        print(f"\nKishu: {kishu}")
    else:
        print_kishu(kishu)
    if args.json:
        Path(args.json).write_text(json.dumps({**(main_part or {}), "heavy": heavy, "kishu": kishu}, indent=1,
                                              default=str))


def print_main(args: argparse.Namespace, part: dict[str, Any]) -> None:
    soj, restore, resume, dill, rerun = part["sojourn"], part["restore"], part["resume"], part["dill"], part["rerun"]
    auto = soj["autosave"]
    first, cells = auto[0], auto[1:]
    scalar = [r for r, c in zip(cells, CELLS, strict=False) if "arrays" not in c]
    onepct = [r for r, c in zip(cells, CELLS, strict=False) if "arrays" in c]
    rows = [
        ("namespace", f"{args.gib:.2f} GiB (4 arrays)", "", ""),
        ("first autosave (full)", f"{first['blocking'] * 1000:.1f} ms blocking, {mib(first['written'])}, "
         f"{first['seconds']:.2f} s background", "", ""),
        ("small-variable cell: blocking", f"{statistics.median(r['blocking'] for r in scalar) * 1000:.1f} ms (median of "
         f"{len(scalar)})", f"{soj['sync'][0]['seconds'] * 1000:.0f} ms (in-kernel capture)",
         f"{dill['dumps'][0]['seconds'] * 1000:.0f} ms" if dill else "-"),
        ("small-variable cell: written", mib(max(r["written"] for r in scalar)), "same as fork",
         mib(dill["dumps"][0]["bytes"]) if dill else "-"),
        ("1% array change: blocking", f"{max(r['blocking'] for r in onepct) * 1000:.1f} ms (max of {len(onepct)})",
         f"{soj['sync'][1]['seconds'] * 1000:.0f} ms (in-kernel capture)",
         f"{dill['dumps'][2]['seconds'] * 1000:.0f} ms" if dill else "-"),
        ("1% array change: written", mib(max(r["written"] for r in onepct)), "same as fork",
         mib(dill["dumps"][2]["bytes"]) if dill else "-"),
        ("autosave background per cell", f"{statistics.median(r['seconds'] for r in cells):.2f} s", "", ""),
        ("restore into a fresh process", f"{restore['seconds']:.2f} s (views {restore['views']}, class "
         f"{restore['class']})", "", f"{dill['load_s']:.2f} s (load_session)" if dill else "-"),
        ("fresh kernel resumed, first cell done", f"{resume:.2f} s", "", ""),
        ("move to another local machine", f"{soj['move']['move_s']:.2f} s; next cell done "
         f"{soj['move']['next_cell_done_s']:.2f} s after the command", "", ""),
        ("re-running all cells instead", f"{rerun:.2f} s -> restore is {100 * (1 - restore['seconds'] / rerun):.0f}% "
         "below", "", ""),
    ]
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    head = ("", "sojourn (fork autosave)", "alternative: sync capture", "dill dump/load_session")
    w = [max(wi, len(h)) for wi, h in zip(w, head, strict=True)]
    print(" | ".join(h.ljust(wi) for h, wi in zip(head, w, strict=True)))
    print("-+-".join("-" * wi for wi in w))
    for r in rows:
        print(" | ".join(c.ljust(wi) for c, wi in zip(r, w, strict=True)))
    mv = soj["move"]
    print(f"\nmove ({mv['busy_loops']} busy loops, load average {mv['loadavg'][0]:.1f} when it started): {mv['text']}"
          f"\nafter the move: {mv['after']}")
    print("per-cell autosave:", [(r["cell"], round(r["blocking"] * 1000, 1), r["written"], round(r["seconds"], 2))
                                 for r in auto])


def print_heavy(heavy: dict[str, Any]) -> None:
    def below(a: float, b: float) -> str:
        return f"{100 * (1 - a / b):3.0f}% below"

    print(f"\nre-running the cells vs restoring (same run, load average {os.getloadavg()[0]:.1f}; see the docstring "
          "for what each clock counts)")
    for name, r in heavy.items():
        print(f"  {name:34s} re-run {r['rerun_s']:6.2f} s | restore {r['restore_s']:5.2f} s "
              f"({below(r['restore_s'], r['rerun_s'])}) | resumed kernel {r['resume_kernel_s']:5.2f} s "
              f"({below(r['resume_kernel_s'], r['rerun_s'])})")
    print("\nwarm standby kernels (the notebook's libraries preloaded), each side from the launch request: "
          "the re-run to its last reply, the resumed kernel to its first reply")
    for name, r in heavy.items():
        w = r["warm"]
        print(f"  {name:34s} re-run {w['rerun_s']:6.2f} s | resumed kernel {w['resume_kernel_s']:5.2f} s "
              f"({below(w['resume_kernel_s'], w['rerun_s'])}; cold: {below(r['resume_kernel_s'], r['rerun_s'])}) "
              f"| preloaded {', '.join(m for m in w['preload'] if m not in ('blake3', 'zstandard'))}")
    print("\nwhere a restore's time goes: importing the notebook's libraries (a fresh interpreter, timed alone) "
          "and sojourn's own part (read, unpickle, fingerprints)")
    for name, r in heavy.items():
        imp, own = r["import_s"], r["restore_after_import_s"]
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["split_timings"].items() if k != "total")
        libs = [m for m in r["imported"] if m not in sys.stdlib_module_names and m not in ("blake3", "zstandard")]
        print(f"  {name:34s} import {imp:5.2f} s ({', '.join(libs)}, ...) + sojourn {own:5.2f} s ({parts}); "
              f"best possible with that import: {below(imp, r['rerun_s'])}; both sides without it: "
              f"re-run {r['rerun_s'] - imp:5.2f} s vs restore {own:5.2f} s ({below(own, r['rerun_s'] - imp)})")


def print_kishu(kishu: dict[str, Any]) -> None:
    ks = [c for c in kishu["cells"] if "arrays" not in c["cell"]]
    kp = [c for c in kishu["cells"] if "arrays" in c["cell"]]

    def kw(cs: list[dict[str, Any]]) -> str:
        return "not measured" if any(c["written"] is None for c in cs) else mib(max(c["written"] for c in cs))

    print(f"\nKishu 0.3.4 (same cells, same run): small-variable cell {statistics.median(c['seconds'] for c in ks) * 1000:.0f} ms"
          f" wall, {kw(ks)} written; 1% array change "
          f"{max(c['seconds'] for c in kp):.2f} s wall, {kw(kp)} written; "
          f"checkout into a fresh kernel {kishu.get('checkout_s', float('nan')):.2f} s "
          f"({kishu.get('checkout_text', '')!r})")
    if "stored_bytes" in kishu:
        print(f"  Kishu's store ({mib(kishu['db_bytes'])} sqlite file next to the notebook) holds "
              f"{mib(kishu['stored_bytes'])} of variable data; co-variables with a version it rates "
              f"unserializable (size inf: that version is not stored, its cells re-run at checkout): "
              f"{kishu['recomputed']}")


if __name__ == "__main__":
    main()

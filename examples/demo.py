"""The main job on the embedded default: a training run moves to a new process mid-epoch.

1. runs examples/train.py plainly, for reference;
2. runs it under `sojourn run` (local repository, this machine), sends the session a real
   SIGTERM in the middle of an epoch: it pauses between two statements and writes a capsule;
3. `sojourn resume` carries it on in a new process, on another Python minor version when one
   is installed (.venv3.12 / .venv3.13 from `make crossvenvs`);
4. compares `sojourn logs` (the workspace's one log across both processes) with the plain run;
5. machines: defines `small` (1 CPU, 2 GiB, one Python) and `big` (another Python), starts a
   longer run on `small` in the background, moves it live to `big` while it trains, prints
   `sojourn show`, and compares its log with an unmoved run again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def sojourn(*args: str, python: str = sys.executable, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "sojourn.cli.main", *args], text=True, **kw)


def other_python() -> str:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for v in ("3.13", "3.12", "3.11"):
        cand = ROOT / f".venv{v}" / "bin" / "python"
        if v != here and cand.exists():
            return str(cand)
    return sys.executable


def main() -> int:
    repo = os.environ.get("SOJOURN_REPO") or str(Path.home() / ".sojourn" / "repo")
    Path(repo).parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sojourn-demo-"))
    script = work / "train.py"
    script.write_text((HERE / "train.py").read_text())

    print("1. the training job, uninterrupted (reference):")
    reference = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True, check=True).stdout
    print("   " + reference.strip().splitlines()[-1])

    print(f"\n2. the same job under `sojourn run` (repository {repo}); a real SIGTERM arrives mid-epoch:")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sojourn.cli.main", "run", "--repo", repo, "--name", f"demo-{os.getpid()}", str(script)],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        print("   | " + line.rstrip())
        if line.startswith("epoch 1 batch  20"):
            t_signal = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            break
    rest, err = proc.communicate(timeout=120)
    for line in rest.splitlines():
        print("   | " + line)
    ws = re.search(r"\b(ws_[0-9a-f]+)", err)
    if proc.returncode != 75 or not ws:
        print(f"   the session did not pause (exit {proc.returncode}):\n{err}")
        return 1
    print(f"   paused and captured in {time.perf_counter() - t_signal:.2f} s; exit code 75; workspace {ws.group(1)}")
    sojourn("ps", "--repo", repo, cwd=work)

    python = other_python()
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True).stdout.strip()
    print(f"\n3. `sojourn resume` carries it on in a new process, Python {version}:")
    res = sojourn("resume", ws.group(1), "--repo", repo, "--python", python, cwd=work, capture_output=True)
    for line in res.stdout.splitlines():
        print("   | " + line)
    if res.returncode != 0:
        print(res.stderr)
        return 1

    print("\n4. the workspace's one log, across both processes, against the uninterrupted run:")
    log = sojourn("logs", ws.group(1), "--repo", repo, "--stream", "stdout", cwd=work, capture_output=True).stdout
    same = log == reference
    print(f"   {len(log.splitlines())} lines in `sojourn logs`, {len(reference.splitlines())} in the reference: "
          + ("identical" if same else "DIFFERENT"))
    if not same:
        print("\nRESULT: MISMATCH")
        return 1
    moved = move_between_machines(repo, work, python)
    print("\nRESULT:", "both moved runs ended exactly like the uninterrupted ones" if moved else "MISMATCH")
    return 0 if moved else 1


def move_between_machines(repo: str, work: Path, other: str) -> bool:
    epochs = "12"
    reference = subprocess.run([sys.executable, "train.py", epochs], cwd=work, capture_output=True, text=True,
                               check=True).stdout
    print("\n5. two machines in the repository's config, and a live move from one to the other:")
    sojourn("machines", "set", "small", "--repo", repo, "--memory", "2GiB", "--cpus", "1", "--python", sys.executable,
            "--price", "0.10", cwd=work, check=True, capture_output=True)
    sojourn("machines", "set", "big", "--repo", repo, "--memory", "16GiB", "--python", other, "--price", "0.80",
            cwd=work, check=True, capture_output=True)
    sojourn("machines", "--repo", repo, cwd=work)
    started = sojourn("run", "--repo", repo, "--on", "small", "--detach", "--name", f"demo-move-{os.getpid()}",
                      "train.py", epochs, cwd=work, capture_output=True)
    ws = re.search(r"\b(ws_[0-9a-f]+)", started.stdout + started.stderr)
    if started.returncode != 0 or not ws:
        print(f"   `sojourn run --on small --detach` failed (exit {started.returncode}):\n{started.stderr}")
        return False
    wid = ws.group(1)
    print(f"   started {wid} on small in the background; waiting for epoch 2...")
    deadline = time.monotonic() + 120
    while "epoch 2" not in sojourn("logs", wid, "--repo", repo, "--stream", "stdout", cwd=work,
                                   capture_output=True).stdout:
        if time.monotonic() > deadline:
            print("   the job did not reach epoch 2 in 120 s")
            return False
        time.sleep(0.3)
    print(f"   $ sojourn move {wid} --to big")
    mv = sojourn("move", wid, "--repo", repo, "--to", "big", cwd=work, capture_output=True)
    print("   " + (mv.stdout + mv.stderr).strip().replace("\n", "\n   "))
    if mv.returncode != 0:
        return False
    while time.monotonic() < deadline + 240:
        info = json.loads(sojourn("show", wid, "--repo", repo, "--json", cwd=work, capture_output=True).stdout)
        if info.get("state") != "running":
            break
        time.sleep(0.5)
    print(f"   $ sojourn show {wid}")
    sojourn("show", wid, "--repo", repo, cwd=work)
    log = sojourn("logs", wid, "--repo", repo, "--stream", "stdout", cwd=work, capture_output=True).stdout
    same = log == reference
    print(f"   {len(log.splitlines())} lines in `sojourn logs` across small and big, {len(reference.splitlines())} in "
          "an unmoved run: " + ("identical" if same else "DIFFERENT"))
    return same


if __name__ == "__main__":
    sys.exit(main())

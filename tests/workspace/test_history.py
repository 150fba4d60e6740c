"""`sojourn fork`, `sojourn history` and `sojourn gc` with real processes.

A fork is resumed in its own process next to its source and the two must diverge from the
fork point with the right output each; the repository must hold their common chunks once.
gc must delete what nothing needs and nothing a kept capsule needs: every check after it
reads every chunk (a resume, or a restore in a fresh interpreter)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import run_py
from tests.workspace.conftest import Shell

# 8 MB of random floats: two 4 MiB chunks that do not compress, shared by every capsule.
# STOPS is read at each call (the prelude's KILLS is a global, so it travels in the capsule).
STOP = """
import os, signal
def kill_here(i):
    if str(i) in os.environ.get("STOPS", "").split(","):
        os.kill(os.getpid(), signal.SIGTERM)
"""

BRANCHY = STOP + """
import numpy as np
data = np.random.default_rng(7).random(1_000_000)
total = 0
for i in range(8):
    total += i
    print(i, flush=True)
    kill_here(i)
    if i == 3:
        branch = os.environ.get("BRANCH", "main")
        print("branch", branch, flush=True)
print("end", branch, total, round(float(data.sum()), 6), flush=True)
"""


def chunk_objects(repo: str) -> tuple[int, int]:
    files = [p for p in (Path(repo) / "chunks").rglob("*") if p.is_file() and not p.name.startswith(".")]
    return len(files), sum(p.stat().st_size for p in files)


def capsule_ids(repo: str) -> set[str]:
    return {p.stem for p in (Path(repo) / "capsules").glob("cap_*.json")}


def check_chunks(repo: str, caps: set[str] | None = None) -> list[str]:
    """Every chunk of every capsule (or of ``caps``) that is missing from the repository."""
    proc = run_py(
        """
import json, sys
from sojourn.capsule import format as fmt
from sojourn.repository.repo import open_repository
with open_repository(sys.argv[1]) as r:
    caps = json.loads(sys.argv[2]) or [n[:-5] for n in r.backend.list("capsules") if n.endswith(".json")]
    missing = []
    for cap in caps:
        m = fmt.load_manifest(r, cap)
        missing += [f"{cap}:{n}" for n in m.all_chunk_names(r.chunks) if r.backend.stat("chunks", n) is None]
print(json.dumps(missing))
""",
        repo, json.dumps(sorted(caps) if caps else []), cwd=Path(repo).parent,
    )
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def expected(sh: Shell, branch: str, start: int) -> str:
    out = sh.plain("branchy.py")
    lines = out.splitlines(keepends=True)
    text = "".join(lines[start:])
    return text.replace("branch main", f"branch {branch}").replace("end main", f"end {branch}")


def fork_json(sh: Shell, *args: str) -> dict[str, Any]:
    p = sh.cli("fork", *args, "--json")
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout))


def test_fork_resumes_both_independently_sharing_chunks(sh: Shell) -> None:
    sh.write("branchy.py", BRANCHY, prelude=False)
    first = sh.cli("run", "--name", "main", "branchy.py", env={"STOPS": "2"})
    assert first.returncode == 75, first.stderr
    assert first.stdout == "0\n1\n2\n"
    src = sh.show("main")
    c1 = src["last_capsule"]["id"]
    n_chunks, n_bytes = chunk_objects(sh.repo)
    assert n_bytes > 8_000_000  # the array's chunks are in there once

    f = fork_json(sh, "main")
    assert f["name"] == "main-fork" and f["capsule"] == c1 and f["source"] == src["id"]
    # Forking writes no chunk and no capsule: the fork stands on the very same capsule.
    assert chunk_objects(sh.repo) == (n_chunks, n_bytes)
    assert capsule_ids(sh.repo) == {c1}
    rec = sh.show("main-fork")
    assert rec["state"] == "suspended" and rec["last_capsule"]["id"] == c1
    assert rec["events"][0]["forked_from"] == {"workspace": src["id"], "name": "main", "capsule": c1}
    assert fork_json(sh, "main")["name"] == "main-fork-2"  # names are made unique

    # Both carry on from the fork point, each with its own environment, and pause again.
    a = sh.cli("resume", "main", env={"BRANCH": "a", "STOPS": "5"})
    b = sh.cli("resume", "main-fork", env={"BRANCH": "b", "STOPS": "6"})
    assert (a.returncode, b.returncode) == (75, 75), a.stderr + b.stderr
    assert a.stdout == "3\nbranch a\n4\n5\n"
    assert b.stdout == "3\nbranch b\n4\n5\n6\n"
    # Two more capsules, and the 8 MB array is still stored once: only pickle streams were new.
    caps = capsule_ids(sh.repo)
    assert len(caps) == 3
    _, b2 = chunk_objects(sh.repo)
    assert b2 - n_bytes < 200_000, (n_bytes, b2)

    a = sh.cli("resume", "main")
    b = sh.cli("resume", "main-fork")
    assert (a.returncode, b.returncode) == (0, 0), a.stderr + b.stderr
    total, data_sum = 28, None
    for out, branch in ((a.stdout, "a"), (b.stdout, "b")):
        end = out.splitlines()[-1].split()
        assert end[:3] == ["end", branch, str(total)], out
        data_sum = data_sum or end[3]
        assert end[3] == data_sum
    # Each workspace's log is its own continuous story.
    assert sh.cli("logs", "main", "--stream", "stdout").stdout == expected(sh, "a", 0)
    assert sh.cli("logs", "main-fork", "--stream", "stdout").stdout == expected(sh, "b", 3)

    # history: c1 is where main-fork branches off; each branch has its own capsule after it.
    h = sh.json("history", "main")
    nodes = {n["capsule"]: n for n in h["nodes"]}
    assert set(nodes) == caps
    assert h["roots"] == [c1]
    assert {fk["name"] for fk in nodes[c1]["forks"]} == {"main-fork", "main-fork-2"}
    kids = nodes[c1]["children"]
    assert len(kids) == 2
    assert {nodes[k]["workspace_name"] for k in kids} == {"main", "main-fork"}
    assert {w["name"] for w in h["workspaces"]} == {"main", "main-fork", "main-fork-2"}
    assert nodes[c1]["workspace_name"] == "main" and nodes[c1]["machine"]
    assert all(nodes[k]["reason"] for k in kids)
    # The fork's own history reaches back into its source up to the fork point.
    hf = sh.json("history", "main-fork")
    assert hf["roots"] == [c1] and len(hf["nodes"]) == 2
    text = sh.cli("history", "main")
    assert text.returncode == 0, text.stderr
    assert "fork → main-fork" in text.stdout and c1[:16] in text.stdout


def test_fork_from_a_chosen_capsule_and_refusals(sh: Shell) -> None:
    sh.write("branchy.py", BRANCHY, prelude=False)
    assert sh.cli("run", "--name", "src", "branchy.py", env={"STOPS": "1"}).returncode == 75
    c1 = sh.show("src")["last_capsule"]["id"]
    assert sh.cli("resume", "src", env={"STOPS": "4"}).returncode == 75
    c2 = sh.show("src")["last_capsule"]["id"]
    assert c2 != c1
    f = fork_json(sh, "src", "--capsule", c1[4:14], "--name", "early")
    assert f["capsule"] == c1 and f["name"] == "early"
    out = sh.cli("resume", "early", env={"BRANCH": "e"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2\n3\nbranch e\n") and "end e 28" in out.stdout
    # A capsule of another workspace, a taken name, an unknown workspace: each refused, and why.
    sh.write("other.py", STOP + "x = 1\nkill_here('x')\nprint(x)\n", prelude=False)
    assert sh.cli("run", "--name", "other", "other.py", env={"STOPS": "x"}).returncode == 75
    theirs = sh.show("other")["last_capsule"]["id"]
    bad = sh.cli("fork", "src", "--capsule", theirs)
    assert bad.returncode == 2 and "not one of workspace" in bad.stderr
    taken = sh.cli("fork", "src", "--name", "early")
    assert taken.returncode == 2 and "taken" in taken.stderr
    assert sh.cli("fork", "nosuch").returncode == 2


def test_gc_deletes_what_nothing_needs_and_keeps_every_live_capsule(sh: Shell, tmp_path: Path) -> None:
    sh.write("branchy.py", BRANCHY, prelude=False)
    assert sh.cli("run", "--name", "job", "branchy.py", env={"STOPS": "1"}).returncode == 75
    c1 = sh.show("job")["last_capsule"]["id"]
    assert sh.cli("resume", "job", env={"STOPS": "4"}).returncode == 75
    f = fork_json(sh, "job", "--capsule", c1, "--name", "side")
    assert sh.cli("resume", "job", env={"STOPS": "6"}).returncode == 75
    c3 = sh.show("job")["last_capsule"]["id"]
    session_caps = capsule_ids(sh.repo)
    assert len(session_caps) == 3
    # Garbage: an orphan capsule (sojourn.capture, no workspace) with its own big array, and a
    # chunk a crashed capture left behind (named by no manifest).
    orphan = run_py(
        """
import sys, numpy as np, sojourn
ref = sojourn.capture({"junk": np.random.default_rng(99).random(700_000)}, sys.argv[1])
print(ref.id)
""",
        sh.repo, cwd=tmp_path,
    ).stdout.strip()
    stray = Path(sh.repo) / "chunks" / "ab" / ("ab" + "0" * 62)
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"left behind by a crash")
    before = chunk_objects(sh.repo)

    dry = sh.json("gc", "--dry-run", "--prune-orphans")
    assert dry["dry_run"] and dry["capsules_pruned"] == [orphan] and dry["chunks_deleted"] >= 3
    assert chunk_objects(sh.repo) == before and orphan in capsule_ids(sh.repo)

    # Plain gc: every capsule stays; only the stray chunk goes.
    g = sh.json("gc")
    assert g["capsules_pruned"] == [] and g["orphans"] == [orphan]
    assert g["chunks_deleted"] == 1 and g["bytes_freed"] == len(b"left behind by a crash")
    assert not stray.exists()
    # --prune-orphans: the orphan and its 5.6 MB go, nothing of the workspaces does.
    g = sh.json("gc", "--prune-orphans")
    assert g["capsules_pruned"] == [orphan] and g["bytes_freed"] > 5_000_000
    assert capsule_ids(sh.repo) == session_caps
    assert check_chunks(sh.repo) == []
    # --keep-last 1: job's middle capsule goes; c1 is a fork point, c3 what job stands on.
    g = sh.json("gc", "--keep-last", "1")
    c2 = (session_caps - {c1, c3}).pop()
    assert g["capsules_pruned"] == [c2]
    assert capsule_ids(sh.repo) == {c1, c3}
    assert check_chunks(sh.repo) == []
    # History still works, and says what was pruned.
    nodes = {n["capsule"]: n for n in sh.json("history", "job")["nodes"]}
    assert nodes[c2]["missing"] and nodes[c3]["parent"] == c2
    # Everything kept still resumes (every chunk is read and checked on the way).
    a = sh.cli("resume", "job")
    b = sh.cli("resume", f["workspace"], env={"BRANCH": "s"})
    assert (a.returncode, b.returncode) == (0, 0), a.stderr + b.stderr
    assert "end main 28" in a.stdout and "end s 28" in b.stdout


def test_gc_keeps_the_capsules_of_a_running_workspace(sh: Shell) -> None:
    sh.write("slow.py", STOP + """
import time
import numpy as np
data = np.random.default_rng(3).random(300_000)
for i in range(400):
    kill_here(i)
    time.sleep(0.05)
print("done", round(float(data.sum()), 3))
""", prelude=False)
    assert sh.cli("run", "--name", "slow", "slow.py", env={"STOPS": "1"}).returncode == 75
    assert sh.cli("resume", "slow", env={"STOPS": "2"}).returncode == 75
    caps = capsule_ids(sh.repo)
    run = sh.start("resume", "slow")
    sh.session_pid("slow")
    g = sh.json("gc", "--keep-last", "1")
    assert g["capsules_pruned"] == [] and any("running" in n for n in g["notes"])
    assert capsule_ids(sh.repo) == caps
    sus = sh.cli("suspend", "slow")
    assert sus.returncode == 0, sus.stderr
    run.communicate(timeout=60)
    assert check_chunks(sh.repo) == []

"""Restored arrays are allocated without numpy's transparent-huge-page advice (first-touch
huge pages made restores 2-3x slower on a small VM), arrays made afterwards get numpy's
advice again, and ``SOJOURN_RESTORE_HUGEPAGES=1`` keeps the advice. What the kernel was
told is read back from ``/proc/self/smaps`` (the ``hg`` flag of the array's mapping)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import last_json, run_py

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")

CAPTURE = """
import json, sys
import numpy as np
import sojourn
a = np.arange(3 * 2**20, dtype=np.float64)  # 24 MiB: numpy advises huge pages from 4 MiB
view = a[10:20]
ref = sojourn.capture({"a": a, "view": view}, sys.argv[1])
print(json.dumps({"id": ref.id}))
"""

RESTORE = """
import json, sys
import numpy as np
import sojourn

def advised(arr):
    # The middle of the array: numpy advises from the first page boundary inside the block.
    addr = arr.__array_interface__["data"][0] + arr.nbytes // 2
    lo = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                lo = (start, end)
            elif line.startswith("VmFlags:") and lo and lo[0] <= addr < lo[1]:
                return "hg" in line.split()[1:]
    raise AssertionError("no mapping holds the array")

ns = sojourn.restore(sys.argv[2], sys.argv[1])
later = np.ones(3 * 2**20)
print(json.dumps({"restored": advised(ns["a"]), "later": advised(later),
                  "equal": bool((ns["a"] == np.arange(3 * 2**20, dtype=np.float64)).all()),
                  "view_shares": ns["view"].base is ns["a"],
                  "advice_on": bool(np._core.multiarray._get_madvise_hugepage())}))
"""


@pytest.mark.skipif(not hasattr(getattr(np, "_core", np), "multiarray"), reason="numpy without _core.multiarray")
def test_restored_arrays_skip_huge_page_advice_unless_asked(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    cap = last_json(run_py(CAPTURE, repo, cwd=tmp_path))
    assert isinstance(cap, dict)
    default = last_json(run_py(RESTORE, repo, cap["id"], cwd=tmp_path))
    assert default == {"restored": False, "later": True, "equal": True, "view_shares": True, "advice_on": True}
    kept = last_json(run_py(RESTORE, repo, cap["id"], cwd=tmp_path, env={"SOJOURN_RESTORE_HUGEPAGES": "1"}))
    assert kept == {"restored": True, "later": True, "equal": True, "view_shares": True, "advice_on": True}

"""A move's destination prefetches the previous capsule (notebook/prefetch.py): chunks that the
new capsule shares are taken as read, only the changed ones are read, values, views and
identity come out as from a plain restore, and a prefetch that fails costs only time. The
destination refuses a move, with the reason, when its ipykernel cannot hold IOPub."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.conftest import last_json, run_py
from tests.notebook.kernels import Kernel

CAPTURE = """
import json, sys
import numpy as np
import sojourn
repo = sys.argv[1]
rng = np.random.default_rng(0)
a = rng.random(3 * (1 << 19))          # 12 MiB: three 4 MiB chunks
b = rng.random(1 << 16)                # 512 KiB, dropped before the second capsule
ns = {"a": a, "head": a[:10], "b": b, "n": 1}
first = sojourn.capture(ns, repo).id
a[-5:] = -1.0                          # the last chunk changes
del ns["b"]
ns["c"] = rng.random(1 << 18)          # new: 2 MiB
ns["n"] = 2
second = sojourn.capture(ns, repo, parent=first).id
print(json.dumps({"first": first, "second": second, "a_sum": float(a.sum()), "c_sum": float(ns["c"].sum())}))
"""

RESTORE = """
import json, sys
from sojourn.capsule.restore import restore_capsule
from sojourn.notebook.prefetch import Prefetch
from sojourn.repository.repo import open_repository
import numpy as np

repo, base, target = sys.argv[1:4]
p = Prefetch(base, repo).start()
assert p.wait(120)
ns = {}
with open_repository(repo) as r:
    restored = restore_capsule(r, target, into=ns, reuse=p.reuse)
print(json.dumps({"stats": p.stats, "error": p.error, "summary": p.summary(), "n": ns["n"],
                  "a_sum": float(ns["a"].sum()), "a_last": float(ns["a"][-1]), "c_sum": float(ns["c"].sum()),
                  "head_is_view": ns["head"].base is ns["a"], "owns": bool(ns["a"].flags.owndata),
                  "hugepage_advice_back": bool(np._core.multiarray._get_madvise_hugepage())}))
"""


def test_prefetched_chunks_are_taken_and_only_changed_ones_read(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    caps = last_json(run_py(CAPTURE, repo, cwd=tmp_path))
    assert isinstance(caps, dict)
    got = last_json(run_py(RESTORE, repo, caps["first"], caps["second"], cwd=tmp_path))
    assert isinstance(got, dict)
    assert got["error"] is None, got
    # a: 2 of its 3 chunks come from the prefetch, 1 is read; c (new) is read whole; the
    # process segment's small arrays (RNG states) did not change
    assert got["stats"]["read"] == 2 and got["stats"]["reused"] >= 2, got
    assert got["n"] == 2 and got["a_last"] == -1.0
    assert got["a_sum"] == caps["a_sum"] and got["c_sum"] == caps["c_sum"]
    assert got["head_is_view"] and got["owns"]
    assert got["hugepage_advice_back"]  # numpy's own advice for arrays made after the restore


def test_a_prefetch_that_fails_only_costs_time(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    caps = last_json(run_py(CAPTURE, repo, cwd=tmp_path))
    assert isinstance(caps, dict)
    got = last_json(run_py(RESTORE, repo, "cap_" + "0" * 32, caps["second"], cwd=tmp_path))
    assert isinstance(got, dict)
    assert got["error"] and "failed" in got["summary"], got
    assert got["stats"]["reused"] == 0 and got["stats"]["read"] >= 4, got
    assert got["a_sum"] == caps["a_sum"] and got["head_is_view"]


def test_a_move_after_an_autosave_reads_only_what_changed(jupyter) -> None:
    k = Kernel(jupyter, SOJOURN_AUTOSAVE="1")
    try:
        k.out("import numpy as np\nbig = np.arange(4 << 20, dtype=np.float64)  # 32 MiB: 8 chunks\nhead = big[:4]")
        k.out("__import__('sojourn.notebook.magics', fromlist=['x']).controller(get_ipython()).autosave.wait(120)")
        pid = k.pid
        out, err, _ = k.run("%sojourn move --to local")
        assert "moved to local" in out and k.pid != pid, out + err
        found = re.search(r"prefetched cap_\w+ in [\d.]+ s: (\d+) of (\d+) chunks reused", out)
        assert found and "timeline after the command" in out, out
        assert int(found[1]) >= 8, out  # big's 8 chunks: the move read none of them again
        assert k.out("print(head.base is big, float(big[-1]), big.flags.owndata)") == f"True {float((4 << 20) - 1)} True"
    finally:
        k.close()


SITE = """import os
if os.environ.get("SOJOURN_HANDOFF"):  # only a move's destination: an ipykernel unlike 7.4
    import ipykernel.iostream
    del ipykernel.iostream.IOPubThread._send_welcome_message
"""


def test_a_destination_whose_ipykernel_cannot_hold_iopub_says_so_and_the_kernel_stays(jupyter, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    k = Kernel(jupyter, PYTHONPATH=path)
    try:
        k.out("values = [1, 2, 3]")
        pid = k.pid
        out, err, _ = k.run("%sojourn move --to local")
        assert "failed; this kernel stays where it was" in err, out + err
        assert "IOPubThread._send_welcome_message(subscription)" in err and "SOJOURN_IOPUB_HOLD=0" in err, err
        assert "Traceback" not in err
        assert k.pid == pid and k.out("values") == "[1, 2, 3]"
    finally:
        k.close()


def test_the_iopub_hold_check_names_what_is_missing(monkeypatch) -> None:
    from ipykernel.iostream import IOPubThread

    from sojourn.notebook import handover

    assert handover.iopub_hold_unsupported() is None  # the ipykernel these tests run on
    monkeypatch.setattr(IOPubThread, "_send_welcome_message", lambda self: None)  # another signature
    why = handover.iopub_hold_unsupported()
    assert why is not None and "IOPubThread._send_welcome_message(subscription)" in why
    assert "_really_send" not in why and "SOJOURN_IOPUB_HOLD=0" in why
    monkeypatch.delattr(IOPubThread, "_really_send")
    why = handover.iopub_hold_unsupported()
    assert why is not None and "IOPubThread._really_send(msg) or IOPubThread._send_welcome_message" in why
    monkeypatch.setattr(handover, "IOPUB_HOLD", 0.0)  # no hold, nothing to check
    assert handover.iopub_hold_unsupported() is None

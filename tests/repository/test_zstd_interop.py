"""Capsules compressed by one zstd module restore where only another exists: ``zstandard``
(3.11-3.13), ``compression.zstd`` (3.14+) and ``backports.zstd`` write the same frames.

Each side runs in a fresh interpreter; the reader has ``zstandard`` made unimportable, as on
a Python 3.15 where it has no wheel.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import last_json, run_py

WRITE = """
import glob, json, sys
{block}
import sojourn
from sojourn.repository import zstd
ns = {{"text": "the same words again " * 50000, "n": 7}}
m = sojourn.capture(ns, repo=sys.argv[1])
print(json.dumps({{"cap": m.id, "impl": zstd.IMPLEMENTATION, "compressed": len(glob.glob(sys.argv[1] + "/chunks/*/*-z"))}}))
"""

READ = """
import json, sys
{block}
import sojourn
from sojourn.repository import zstd
ns = sojourn.restore(sys.argv[2], repo=sys.argv[1])
print(json.dumps({{"impl": zstd.IMPLEMENTATION, "ok": ns["text"] == "the same words again " * 50000,
                  "zstandard": sys.modules.get("zstandard") is not None}}))
"""

NO_ZSTANDARD = "sys.modules['zstandard'] = None  # as where zstandard has no wheel"

needs_other = pytest.mark.skipif(
    importlib.util.find_spec("backports.zstd") is None and importlib.util.find_spec("compression.zstd") is None,
    reason="neither backports.zstd nor compression.zstd is installed (pip install backports.zstd)",
)


@needs_other
@pytest.mark.parametrize("writer_blocks", [False, True], ids=["zstandard-writes", "zstandard-reads"])
def test_capsule_crosses_zstd_modules(tmp_path, repo, writer_blocks):
    other = NO_ZSTANDARD
    w = last_json(run_py(WRITE.format(block=other if writer_blocks else ""), repo, cwd=tmp_path))
    assert w["compressed"] >= 1, w  # the stream really is compressed
    r = last_json(run_py(READ.format(block="" if writer_blocks else other), repo, w["cap"], cwd=tmp_path))
    assert r["ok"], r
    impls = {w["impl"], r["impl"]}
    assert "zstandard" in impls and len(impls) == 2, (w, r)
    assert r["zstandard"] == writer_blocks


def test_no_zstd_at_all_says_what_to_install(tmp_path):
    proc = run_py("""
import sys
sys.modules['zstandard'] = None
sys.modules['compression.zstd'] = None
sys.modules['backports.zstd'] = None
sys.modules['backports'] = None
import sojourn
sojourn.capture({"a": 1}, repo=sys.argv[1])
""", str(tmp_path / "r"), cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "install `zstandard`" in proc.stderr and "backports.zstd" in proc.stderr, proc.stderr

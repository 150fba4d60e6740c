"""Byte order on this machine alone (no qemu): what the cross-architecture tests rely on.

The capsule is little-endian everywhere; on a little-endian machine what changes is only
what a byte order can be seen through: views that reinterpret their base's bytes, arrays
the program gave an explicit order, read-only arrays.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import last_json, run_py

np = pytest.importorskip("numpy")

PROGRAM = Path(__file__).with_name("values_program.py")


def test_every_byte_sensitive_value_round_trips_here(tmp_path: Path) -> None:
    shutil.copy(PROGRAM, tmp_path / PROGRAM.name)
    repo = str(tmp_path / "repo")
    cap = run_py(PROGRAM.read_text(), "capture", repo, cwd=tmp_path).stdout.strip()
    out = json.loads(run_py(PROGRAM.read_text(), "check", repo, cap, "again", cwd=tmp_path).stdout.splitlines()[-1])
    assert out["failures"] == [] and out["verify"] == [True, None], out
    again = json.loads(run_py(PROGRAM.read_text(), "check", repo, out["capsule"], cwd=tmp_path).stdout.splitlines()[-1])
    assert again["failures"] == [] and again["verify"] == [True, None], again


def test_read_only_arrays_come_back_read_only(tmp_path: Path, repo: str) -> None:
    import sojourn

    a = np.arange(6.0)
    a.flags.writeable = False
    ref = sojourn.capture({"a": a, "v": a[1:4], "pair": [a, a]}, repo)
    proc = run_py(f"""
        import json, numpy as np, sojourn
        ns = sojourn.restore({ref.id!r}, {repo!r})
        a, v = ns["a"], ns["v"]
        print(json.dumps({{"type": type(a).__name__, "values": a.tolist(), "writeable": a.flags.writeable,
                          "view_base": v.base is a, "view_writeable": v.flags.writeable,
                          "pair": ns["pair"][0] is a is ns["pair"][1]}}))
    """, cwd=tmp_path)
    assert last_json(proc) == {"type": "ndarray", "values": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "writeable": False,
                               "view_base": True, "view_writeable": False, "pair": True}


def test_a_view_that_reinterprets_bytes_keeps_this_machines_order(tmp_path: Path, repo: str) -> None:
    """``x.view(np.uint8)`` sees x's bytes: the capsule says x's order is explicit, so that
    on a machine of the other byte order x keeps its bytes and the view its values. Here
    both come back as they were; later views of x stay views."""
    import sojourn
    from sojourn.capsule import format as fmt
    from sojourn.repository.repo import open_repository

    x = np.array([1.5, -2.0, 3.25])
    ref = sojourn.capture({"early": x[1:], "x": x, "raw": x.view(np.uint8), "late": x[::2]}, repo)
    with open_repository(repo) as r:
        manifest = fmt.load_manifest(r, ref.id)
    (root,) = [b for b in manifest.buffers if b.kind == "ndarray" and b.meta["shape"] == [3]]
    little = sys.byteorder == "little"
    assert root.meta["dtype"] == "<f8" and root.meta.get("explicit") == ([0] if little else None), root.meta
    proc = run_py(f"""
        import json, numpy as np, sojourn
        ns = sojourn.restore({ref.id!r}, {repo!r})
        x = ns["x"]
        print(json.dumps({{"x": x.tolist(), "order": x.dtype.str, "raw": ns["raw"].tolist(),
                          "bases": [ns[k].base is x for k in ("early", "raw", "late")],
                          "views": [ns["early"].tolist(), ns["late"].tolist()]}}))
        x[1] = 7.0  # one memory
        print(json.dumps([ns["early"][0], ns["raw"][8:16].tolist() == np.array([7.0], "<f8").view(np.uint8).tolist()]))
    """, cwd=tmp_path)
    first, second = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert first == {"x": [1.5, -2.0, 3.25], "order": "<f8", "raw": np.array([1.5, -2.0, 3.25], "<f8").view(np.uint8).tolist(),
                     "bases": [True, True, True], "views": [[-2.0, 3.25], [1.5, 3.25]]}
    assert second == [7.0, True]


def test_restore_refuses_arrays_rebuilt_in_another_byte_order(tmp_path: Path, repo: str) -> None:
    """An array's dtype lives in its buffer's meta, outside the fingerprint: an array rebuilt
    in the wrong byte order has the captured bytes and would pass the fingerprint check
    with wrong values. The restore compares the meta too; here it is made to swap the
    order, as a byte-order bug would, and refuses."""
    import sojourn

    ref = sojourn.capture({"x": np.array([1.5, -2.0])}, repo)
    proc = run_py(f"""
        import sojourn
        from sojourn.capsule.reducers import numpy_order
        right = numpy_order.decode_descr
        numpy_order.decode_descr = lambda descr, explicit=None: right(descr, explicit).newbyteorder("S")
        try:
            print(sojourn.restore({ref.id!r}, {repo!r})["x"])
        except Exception as e:
            print(type(e).__name__, e)
    """, cwd=tmp_path)
    assert "IntegrityError" in proc.stdout and "'x'" in proc.stdout and "byte order" in proc.stdout, proc.stdout


def test_a_capsule_in_a_big_endian_machines_own_order_is_refused_clearly(tmp_path: Path, repo: str) -> None:
    """Capsules written on big-endian machines before the format recorded its byte order are
    in that machine's order: refused before anything is read, saying where to restore it."""
    import sojourn
    from sojourn.capsule import format as fmt
    from sojourn.repository.repo import open_repository

    ref = sojourn.capture({"x": np.arange(3, dtype=np.int32)}, repo)
    with open_repository(repo) as r:
        body = fmt.load_manifest(r, ref.id).body()
        del body["byteorder"]
        body["environment"] = dict(body["environment"], machine="s390x", byteorder="big")
        doc = _sealed(body, r.key)
        old = fmt.open_manifest(doc, r.key)
        assert old.byteorder == "big"
        r.backend.save("capsules", old.id + ".json", doc)
        cap = old.id
    proc = run_py(f"""
        import sojourn
        try:
            sojourn.restore({cap!r}, {repo!r})
        except Exception as e:
            print(type(e).__name__, e)
    """, cwd=tmp_path)
    assert proc.stdout.startswith("IntegrityError") and "s390x" in proc.stdout and "big-endian" in proc.stdout, proc.stdout


def _sealed(body: dict, key: bytes) -> bytes:
    """A manifest document as an older sojourn signed it (no byteorder field)."""
    import hashlib
    import hmac

    import blake3

    doc = dict(body)
    canon = lambda o: json.dumps(o, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()  # noqa: E731
    doc["id"] = "cap_" + blake3.blake3(canon(doc)).hexdigest()[:32]
    doc["signature"] = hmac.new(key, canon(doc), hashlib.sha256).hexdigest()
    return json.dumps(doc).encode()

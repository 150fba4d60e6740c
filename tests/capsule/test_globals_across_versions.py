"""A library class that one Python version names from another module still compares equal.

``pathlib.Path`` is ``pathlib.Path`` on 3.12 and ``pathlib._local.Path`` on 3.13: a capsule
holding the class (a module's ``from pathlib import Path``, numpy's asv benchmarks) written
on 3.12 was refused on 3.13 by its fingerprint check although it is the same class.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import last_json, needs_python, run_py


def test_a_class_named_from_another_module_on_3_13_restores(tmp_path: Path, repo: str) -> None:
    py312, py313 = needs_python("3.12"), needs_python("3.13")
    run_py(f"""
        import pathlib, sojourn
        ns = {{"Path": pathlib.Path, "PosixPath": pathlib.PosixPath, "where": pathlib.PurePosixPath("/a/b"),
               "kinds": [pathlib.Path, pathlib.PurePath]}}
        print(sojourn.capture(ns, {repo!r}).id)
    """, cwd=tmp_path, python=py312)
    (cap,) = [p.stem for p in (Path(repo) / "capsules").glob("cap_*.json")]
    proc = run_py(f"""
        import json, pathlib, sojourn
        ns = sojourn.restore({cap!r}, {repo!r})
        print(json.dumps([ns["Path"] is pathlib.Path, ns["kinds"][1] is pathlib.PurePath, str(ns["where"]),
                          sojourn.verify({cap!r}, {repo!r}).ok]))
    """, cwd=tmp_path, python=py313)
    assert last_json(proc) == [True, True, "/a/b", True]

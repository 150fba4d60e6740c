"""The requirement lines a build installs, per recorded origin and policy; what differs; the
environment's key; the refusal's one line."""

from __future__ import annotations

from pathlib import Path

from sojourn.environment import plan


def test_requirements_follow_the_recorded_origin(tmp_path: Path) -> None:
    here = tmp_path / "checkout"
    here.mkdir()
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    cases = [
        ("numpy", "2.4.6", {"kind": "index"}, "numpy==2.4.6"),
        ("torch", "2.13.0+cpu", {"kind": "index"}, "torch==2.13.0"),  # the build is the index's choice
        ("lib", "0.1", {"kind": "vcs", "vcs": "git", "url": "https://example.invalid/lib.git", "commit": "abc123"},
         "lib @ git+https://example.invalid/lib.git@abc123"),
        ("mine", "0.3", {"kind": "editable", "url": f"file://{here}"}, f"mine @ file://{here}"),
        ("gone", "0.3", {"kind": "editable", "url": f"file://{tmp_path / 'elsewhere'}"}, "gone==0.3"),
        ("w", "1.0", {"kind": "wheel", "url": f"file://{wheel}"}, f"w @ file://{wheel}"),
    ]
    for name, version, source, want in cases:
        assert plan.requirement(name, {"version": version, "source": source}) == want
    assert plan.requirement("numpy", {"version": "2.4.6"}, "compatible") == "numpy>=2.4.6,<3"


def test_differences_by_policy() -> None:
    packages = {"numpy": {"version": "2.4.6"}, "Python_Dateutil": {"version": "2.9.0"}, "six": {"version": "1.17.0"}}
    installed = {"numpy": "2.5.5", "python-dateutil": "2.9.0"}
    assert plan.differences(packages, installed, "exact") == [
        "numpy 2.5.5 is installed, 2.4.6 was recorded", "six 1.17.0 is missing"]
    assert plan.differences(packages, installed, "compatible") == ["six 1.17.0 is missing"]
    assert plan.differences({"torch": {"version": "2.13.0+cpu"}}, {"torch": "2.13.0+cu124"}) == []


def test_the_key_names_interpreter_requirements_policy_and_sojourn() -> None:
    py = {"version": "3.12.1", "implementation": "cpython", "platform": "linux", "machine": "x86_64", "python": "/a"}
    pk = {"numpy": {"version": "2.4.6"}}
    k = plan.key(py, pk, "exact", "release:0.1.0")
    assert k == plan.key({**py, "python": "/b"}, pk, "exact", "release:0.1.0")  # same interpreter, another path
    others = [plan.key({**py, "machine": "aarch64"}, pk, "exact", "release:0.1.0"),
              plan.key({**py, "version": "3.13.0"}, pk, "exact", "release:0.1.0"),
              plan.key(py, {"numpy": {"version": "2.5.0"}}, "exact", "release:0.1.0"),
              plan.key(py, pk, "compatible", "release:0.1.0"),
              plan.key(py, pk, "exact", "release:0.2.0")]
    assert len({k, *others}) == 6


def test_the_refusal_is_one_line_with_the_fix() -> None:
    missing = [plan.Missing("sklearn", "scikit-learn", "1.8.0", ("model", "pipe", "a", "b", "c")),
               plan.Missing("weird", None, None, ())]
    line = plan.refusal("cap_x", missing, "/usr/bin/python3.12")
    assert "\n" not in line
    assert "scikit-learn 1.8.0 (module sklearn) for 'model', 'pipe', 'a', 'b', …" in line
    assert "module 'weird'" in line
    assert "uv pip install --python /usr/bin/python3.12 'scikit-learn==1.8.0' 'weird'" in line

"""Real Jupyter kernels for the notebook tests: the ``sojourn`` kernelspec in a private
JUPYTER_PATH, the provisioner registered with jupyter_client, and every kernel process that
a test saw checked dead at its end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _mod in ("jupyter_client", "nbclient", "nbformat", "ipykernel"):
    pytest.importorskip(_mod, reason=f"{_mod} is not installed (pip install 'sojourn[jupyter]')")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "examples" / "notebooks"


def register_provisioner() -> None:
    """What the ``jupyter_client.kernel_provisioners`` entry point does once sojourn is
    installed with it; an editable install made before the entry point existed lacks it."""
    from importlib.metadata import EntryPoint

    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    factory.provisioners.setdefault("sojourn-provisioner", EntryPoint(
        name="sojourn-provisioner", value="sojourn.notebook.provisioner:SojournProvisioner",
        group="jupyter_client.kernel_provisioners"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Pids:
    def __init__(self) -> None:
        self.seen: set[int] = set()

    def add(self, km: Any) -> int:
        pid = int(km.provisioner.pid)
        self.seen.add(pid)
        return pid


@pytest.fixture
def jupyter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pids]:
    from sojourn.notebook.kernelspec import write

    write(tmp_path / "jupyter" / "kernels" / "sojourn")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("SOJOURN_REPO", str(tmp_path / "repo"))
    monkeypatch.delenv("SOJOURN_AUTOSAVE", raising=False)
    monkeypatch.chdir(tmp_path)
    register_provisioner()
    pids = Pids()
    yield pids
    left = sorted(p for p in pids.seen if _alive(p))
    for p in left:
        os.kill(p, 9)
    assert not left, f"kernel processes left behind: {left}"

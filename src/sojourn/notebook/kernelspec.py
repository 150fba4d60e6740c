"""The ``sojourn`` kernelspec: an ipykernel started by the sojourn launcher and managed by
the sojourn provisioner (named in the spec's metadata, as jupyter_client expects)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

PROVISIONER = "sojourn-provisioner"


def spec(*, python: str | None = None, machine: str = "local", repo: str | None = None,
         autosave: bool = False, display_name: str = "Python 3 (sojourn)", standby: int = 0,
         standby_preload: list[str] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"machine": machine, "autosave": autosave}
    if repo:
        config["repo"] = repo
    if standby:  # warm standby kernels (docs/notebooks.md)
        config["standby"] = standby
    if standby_preload:
        config["standby_preload"] = list(standby_preload)
    return {
        "argv": [python or sys.executable, "-m", "sojourn.notebook.launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER, "config": config},
                     "debugger": False},
    }


def write(directory: Path, **kw: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kernel.json").write_text(json.dumps(spec(**kw), indent=2) + "\n")
    return directory


def install(name: str = "sojourn", *, user: bool = True, prefix: str | None = None, **kw: Any) -> str:
    """Install the kernelspec where Jupyter finds it; returns its directory."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp) / name, **kw)
        return str(KernelSpecManager().install_kernel_spec(str(Path(tmp) / name), name, user=user and not prefix,
                                                           prefix=prefix))

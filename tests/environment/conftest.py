"""A real installed distribution made for the tests: a package and its ``.dist-info`` in a
site directory that a test puts on one interpreter's path and not on another's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

SRC_PKG = '''
class Thing:
    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return isinstance(other, Thing) and other.n == self.n
'''


def make_dist(site: Path, name: str = "envdemo", version: str = "1.2.3", *, requires: tuple[str, ...] = ("six",),
              direct_url: dict[str, object] | None = None) -> Path:
    pkg = site / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(SRC_PKG)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    meta += ['Requires-Dist: pytest ; extra == "test"']  # an extra: not a requirement of the program
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (info / "top_level.txt").write_text(name + "\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return site


def user_site(base: Path) -> Path:
    return base / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    # A user site-packages (under $PYTHONUSERBASE): a library location for sojourn (a module on
    # a plain PYTHONPATH directory is a workspace module, which travels as source).
    d = user_site(tmp_path / "userbase")
    make_dist(d, direct_url={"url": f"file://{tmp_path / 'checkout'}", "dir_info": {"editable": True}})
    return d


def with_path(site: Path) -> dict[str, str]:
    """run_py's env for an interpreter that has the site's distributions (a venv ignores the
    user site: it is put on PYTHONPATH, after sojourn's src)."""
    from tests.conftest import SRC

    return {"PYTHONPATH": os.pathsep.join([str(SRC), str(site)]), "PYTHONUSERBASE": str(site.parents[2])}

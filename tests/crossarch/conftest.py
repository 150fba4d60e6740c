"""The cross-architecture tests run after every other test of the session: CI builds their
rootfs in the background meanwhile (``.ci/run``), and a test that waits for it there wastes
less of the suite's time the later it comes."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ours = [i for i in items if HERE in Path(str(i.path)).resolve().parents]
    if ours:
        rest = [i for i in items if i not in ours]
        items[:] = rest + ours

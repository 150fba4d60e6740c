from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.notices.metadata_server import MetadataServer
from tests.workspace.conftest import sh  # noqa: F401  (the `sojourn` command in real processes)


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    """AWS, GCE and Azure metadata endpoints on 127.0.0.1, with their real payloads."""
    srv = MetadataServer().start()
    try:
        yield srv
    finally:
        srv.stop()

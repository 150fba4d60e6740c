"""The in-memory backend passes the conformance suite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from sojourn.repository.memory import MemoryBackend
from tests.repository.conformance import (
    BackendConformance,
    ChunkStoreConformance,
    NewBackend,
    SealedConformance,
)


def _memory_backends() -> Iterator[NewBackend]:
    made: list[MemoryBackend] = []

    def make() -> MemoryBackend:
        b = MemoryBackend(f"test-{uuid.uuid4().hex}")
        made.append(b)
        return b

    yield make
    for b in made:
        b.clear()


class TestMemorySealed(SealedConformance):
    @pytest.fixture
    def new_plain_backend(self) -> Iterator[NewBackend]:
        yield from _memory_backends()


class TestMemoryBackend(BackendConformance, ChunkStoreConformance):
    @pytest.fixture
    def new_backend(self) -> Iterator[NewBackend]:
        made: list[MemoryBackend] = []

        def make() -> MemoryBackend:
            b = MemoryBackend(f"test-{uuid.uuid4().hex}")
            made.append(b)
            return b

        yield make
        for b in made:
            b.clear()

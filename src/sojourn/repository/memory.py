"""An in-memory backend: the core stays testable without I/O (``memory://NAME``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from sojourn.errors import AlreadyExists, ObjectNotFound
from sojourn.repository.backend import check_kind, check_name

# Named stores live for the life of the process so that two opens of one URL agree.
_STORES: dict[str, dict[tuple[str, str], bytes]] = {}
_LOCK = threading.Lock()


class MemoryBackend:
    def __init__(self, name: str = "default"):
        self.url = f"memory://{name}"
        self._name = name

    @property
    def _objects(self) -> dict[tuple[str, str], bytes]:
        return _STORES.setdefault(self._name, {})

    def exists(self) -> bool:
        return self._name in _STORES

    def create(self) -> None:
        with _LOCK:
            _STORES.setdefault(self._name, {})

    def save(self, kind: str, name: str, data: bytes | memoryview, *, exclusive: bool = False) -> None:
        check_kind(kind)
        check_name(name)
        blob = bytes(data)
        with _LOCK:
            if exclusive and (kind, name) in self._objects:
                raise AlreadyExists(f"{kind}/{name} already exists in {self.url}")
            self._objects[(kind, name)] = blob

    def load(self, kind: str, name: str) -> bytes:
        check_kind(kind)
        check_name(name)
        try:
            return self._objects[(kind, name)]
        except KeyError:
            raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None

    def load_into(self, kind: str, name: str, out: memoryview) -> int:
        blob = self.load(kind, name)
        if len(blob) != len(out):
            raise ObjectNotFound(f"{kind}/{name} in {self.url} is {len(blob)} bytes, expected {len(out)}")
        out[:] = blob
        return len(blob)

    def load_scatter(self, kind: str, name: str, parts: list[memoryview]) -> int:
        blob = self.load(kind, name)
        if len(blob) == sum(len(p) for p in parts):
            at = 0
            for part in parts:
                part[:] = blob[at : at + len(part)]
                at += len(part)
        return len(blob)

    def stat(self, kind: str, name: str) -> int | None:
        check_kind(kind)
        check_name(name)
        blob = self._objects.get((kind, name))
        return None if blob is None else len(blob)

    def list(self, kind: str, prefix: str = "") -> Iterator[str]:
        check_kind(kind)
        with _LOCK:
            names = [n for (k, n) in self._objects if k == kind and n.startswith(prefix)]
        yield from sorted(names)

    def remove(self, kind: str, name: str) -> None:
        check_kind(kind)
        check_name(name)
        with _LOCK:
            if self._objects.pop((kind, name), None) is None:
                raise ObjectNotFound(f"{kind}/{name} not found in {self.url}")

    def flush(self) -> None:
        pass

    def clear(self) -> None:
        """Forget this store (tests)."""
        with _LOCK:
            _STORES.pop(self._name, None)

"""The backend a :class:`~sojourn.repository.repo.Repository` hands out: retries and, in an
encrypted repository, sealing, around the plain backend (restic's layering: the backends
themselves stay seven small methods).

Every operation goes through the repository's :class:`~sojourn.repository.retry.RetryPolicy`.
Objects of the kinds an encrypted repository seals (see :mod:`sojourn.repository.crypto`)
are sealed on ``save`` and opened on ``load``; ``load_into`` reads a sealed object's
ciphertext straight into the caller's buffer (the backend's ``load_scatter``) and decrypts it
there, so a restored array is still read with no copy of its bytes; ``stat`` reports the
plain size. Anything else (``root``, ``bucket``, ``compress_below``…) is the plain backend's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sojourn.errors import AlreadyExists, ObjectNotFound
from sojourn.repository import crypto
from sojourn.repository.backend import Backend, check_kind, check_name
from sojourn.repository.retry import RetryPolicy

_CLASSES: dict[str, type[GuardedBackend]] = {}


def guard(inner: Backend, policy: RetryPolicy, sealer: crypto.Sealer | None = None) -> GuardedBackend:
    """``inner`` behind retries (and ``sealer``). The wrapper's class has the plain backend's
    class name, which callers read to tune themselves (a poll interval for S3, one gc thread
    for a local disk)."""
    name = type(inner).__name__
    cls = _CLASSES.get(name)
    if cls is None:
        cls = _CLASSES[name] = type(name, (GuardedBackend,), {"__doc__": GuardedBackend.__doc__})
    return cls(inner, policy, sealer)


class GuardedBackend:
    """A backend with retries and, when ``sealer`` is set, encryption (see the module doc)."""

    def __init__(self, inner: Backend, policy: RetryPolicy, sealer: crypto.Sealer | None = None):
        self.inner = inner
        self.url = inner.url
        self.policy = policy
        self.sealer = sealer

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this class lacks: the plain backend's own.
        if name in ("inner", "url", "policy", "sealer"):
            raise AttributeError(name)
        return getattr(self.inner, name)


    @property
    def encrypted(self) -> bool:
        return self.sealer is not None

    def _sealed(self, kind: str, name: str) -> bool:
        return self.sealer is not None and crypto.encrypts(kind, name)

    # -- location ---------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.policy.call("opening the repository", self.inner.exists)

    def create(self) -> None:
        self.policy.call("creating the repository", self.inner.create)

    def flush(self) -> None:
        self.policy.call("making writes durable", self.inner.flush)

    # -- objects ----------------------------------------------------------------------------

    def save(self, kind: str, name: str, data: bytes | memoryview, *, exclusive: bool = False) -> None:
        check_kind(kind)
        check_name(name)
        payload = self.sealer.seal(kind, name, data) if self.sealer is not None and crypto.encrypts(kind, name) else data

        def ours(error: BaseException) -> None:
            # A retried exclusive create that finds the object: it is ours when it holds our
            # bytes (the earlier attempt landed, its answer was lost). Sealed bytes carry a
            # random nonce, so no other writer's object can match them.
            if isinstance(error, AlreadyExists):
                stored = self.policy.call(f"reading {kind}/{name}", lambda: self.inner.load(kind, name))
                if stored == bytes(payload):
                    return
            raise error

        self.policy.call(
            f"writing {kind}/{name}",
            lambda: self.inner.save(kind, name, payload, exclusive=exclusive),
            resolve=ours if exclusive else None,
        )

    def load(self, kind: str, name: str) -> bytes:
        blob = self.policy.call(f"reading {kind}/{name}", lambda: self.inner.load(kind, name))
        if self._sealed(kind, name):
            assert self.sealer is not None
            return self.sealer.open(kind, name, blob)
        return blob

    def load_into(self, kind: str, name: str, out: memoryview) -> int:
        if not self._sealed(kind, name):
            return self.policy.call(f"reading {kind}/{name}", lambda: self.inner.load_into(kind, name, out))
        assert self.sealer is not None
        check_kind(kind)
        check_name(name)
        view = out.cast("B") if (out.ndim != 1 or out.format != "B") else out
        head, tag = memoryview(bytearray(crypto.HEADER)), memoryview(bytearray(crypto.TAG))
        scatter = getattr(self.inner, "load_scatter", None)
        if scatter is not None:
            size = self.policy.call(f"reading {kind}/{name}", lambda: scatter(kind, name, [head, view, tag]))
        else:
            blob = self.policy.call(f"reading {kind}/{name}", lambda: self.inner.load(kind, name))
            size = len(blob)
            if size == crypto.OVERHEAD + len(view):
                head[:] = blob[: crypto.HEADER]
                view[:] = blob[crypto.HEADER : size - crypto.TAG]
                tag[:] = blob[size - crypto.TAG :]
        if size != crypto.OVERHEAD + len(view):
            raise ObjectNotFound(
                f"{kind}/{name} in {self.url} is {max(0, size - crypto.OVERHEAD)} bytes, expected {len(view)} "
                "(truncated or replaced)"
            )
        self.sealer.open_into(kind, name, head, view, tag)
        return len(view)

    def stat(self, kind: str, name: str) -> int | None:
        size = self.policy.call(f"reading {kind}/{name}", lambda: self.inner.stat(kind, name))
        if size is not None and self._sealed(kind, name):
            return max(0, size - crypto.OVERHEAD)
        return size

    def list(self, kind: str, prefix: str = "") -> Iterator[str]:
        check_kind(kind)
        # Whole, so that a retry after a failure halfway does not yield names twice.
        return iter(self.policy.call(f"listing {kind}/", lambda: list(self.inner.list(kind, prefix))))

    def remove(self, kind: str, name: str) -> None:
        def gone(error: BaseException) -> None:
            if isinstance(error, ObjectNotFound):
                return  # the earlier attempt removed it; its answer was lost
            raise error

        self.policy.call(f"removing {kind}/{name}", lambda: self.inner.remove(kind, name), resolve=gone)

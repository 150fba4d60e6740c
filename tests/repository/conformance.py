"""The one conformance suite every backend passes (memory, local, S3), fsspec/restic style.

A test module subclasses :class:`BackendConformance` (and :class:`ChunkStoreConformance`)
and provides the ``new_backend`` fixture: a factory that returns a backend for a location
that does not exist yet. Everything here goes through the :class:`Backend` protocol only, so
a new backend gets the whole suite by writing that one fixture. A wrapped backend (the
encrypted one) also overrides :meth:`BackendConformance.reopen` (how a second process opens
the same URL) and :meth:`ChunkStoreConformance.store` (its chunk names).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import zstandard

from sojourn.errors import AlreadyExists, IntegrityError, ObjectNotFound, RepositoryError
from sojourn.repository.backend import KINDS, Backend
from sojourn.repository.chunks import BufferRecord, ChunkStore, WriteStats, chunk_hash
from sojourn.repository.repo import backend_for

NewBackend = Callable[[], Backend]

BAD_NAMES = ["", ".", "..", ".hidden", "a/b", "/abs", "a\\b", "a\0b"]
BAD_KINDS = ["", "secrets", "chunk", "../chunks"]


def _race(n: int, fn: Callable[[int], object]) -> list[object]:
    """Run ``fn(i)`` on ``n`` threads released together; return results or exceptions."""
    barrier = threading.Barrier(n)

    def go(i: int) -> object:
        barrier.wait()
        try:
            return fn(i)
        except Exception as e:
            return e

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


class BackendConformance:
    """What every backend guarantees (see ``sojourn/repository/backend.py``)."""

    @pytest.fixture
    def new_backend(self) -> NewBackend:
        raise NotImplementedError("a conformance subclass provides the new_backend fixture")

    @pytest.fixture
    def backend(self, new_backend: NewBackend) -> Backend:
        b = new_backend()
        b.create()
        return b

    def reopen(self, backend: Backend) -> Backend:
        """The same location, opened afresh (as another process would)."""
        return backend_for(backend.url)

    # -- the location ------------------------------------------------------------------------

    def test_is_a_backend(self, backend: Backend) -> None:
        assert isinstance(backend, Backend)
        assert isinstance(backend.url, str) and backend.url

    def test_create_makes_the_location_exist_and_is_idempotent(self, new_backend: NewBackend) -> None:
        b = new_backend()
        assert not b.exists()
        b.create()
        assert b.exists()
        b.create()
        assert b.exists()
        for kind in KINDS:
            assert list(b.list(kind)) == []

    def test_url_reopens_the_same_objects(self, backend: Backend) -> None:
        backend.save("config", "config.json", b"{}")
        backend.save("chunks", "ab12", b"chunk")
        backend.flush()
        again = self.reopen(backend)
        assert type(again) is type(backend)
        assert again.exists()
        assert again.load("config", "config.json") == b"{}"
        assert again.load("chunks", "ab12") == b"chunk"
        assert list(again.list("chunks")) == ["ab12"]

    # -- save / load -------------------------------------------------------------------------

    def test_save_and_load_round_trip(self, backend: Backend) -> None:
        big = os.urandom((9 << 20) + 17)  # larger than any single read the backends do
        payloads: dict[str, bytes | memoryview] = {
            "bytes": b"hello",
            "bytearray": memoryview(bytearray(b"\x00\x01\x02" * 100)),
            "slice": memoryview(b"0123456789")[3:7],
            "empty": b"",
            "big": big,
        }
        for name, data in payloads.items():
            backend.save("capsules", name, data)
        for name, data in payloads.items():
            assert backend.load("capsules", name) == bytes(data), name
            assert backend.stat("capsules", name) == len(data), name

    def test_load_into_fills_a_buffer_of_exactly_the_size(self, backend: Backend) -> None:
        for name, data in {"small": b"abcdef", "empty": b"", "big": os.urandom((9 << 20) + 5)}.items():
            backend.save("chunks", name, data)
            out = bytearray(len(data))
            assert backend.load_into("chunks", name, memoryview(out)) == len(data)
            assert out == data
        # into a slice of a larger buffer: only that slice changes
        big = bytearray(b"." * 10)
        assert backend.load_into("chunks", "small", memoryview(big)[2:8]) == 6
        assert big == b"..abcdef.."

    def test_load_into_a_buffer_of_the_wrong_size_is_refused(self, backend: Backend) -> None:
        backend.save("chunks", "sized", b"abcdef")
        for size in (5, 7):
            out = bytearray(b"x" * size)
            with pytest.raises(ObjectNotFound, match=r"chunks/sized.*6.*expected " + str(size)):
                backend.load_into("chunks", "sized", memoryview(out))

    def test_kinds_are_separate_namespaces(self, backend: Backend) -> None:
        for kind in KINDS:
            backend.save(kind, "same-name", kind.encode())
        for kind in KINDS:
            assert backend.load(kind, "same-name") == kind.encode()
            assert list(backend.list(kind)) == ["same-name"]

    def test_save_replaces_an_existing_object(self, backend: Backend) -> None:
        backend.save("workspaces", "w", b"first version, longer")
        backend.save("workspaces", "w", b"second")
        assert backend.load("workspaces", "w") == b"second"
        assert backend.stat("workspaces", "w") == 6
        assert list(backend.list("workspaces")) == ["w"]

    # -- exclusive create --------------------------------------------------------------------

    def test_exclusive_save_creates_once(self, backend: Backend) -> None:
        backend.save("locks", "lock", b"mine", exclusive=True)
        with pytest.raises(AlreadyExists, match="locks/lock already exists") as info:
            backend.save("locks", "lock", b"theirs", exclusive=True)
        assert isinstance(info.value, FileExistsError) and isinstance(info.value, RepositoryError)
        assert backend.load("locks", "lock") == b"mine"
        # an object written without exclusive=True counts as existing too
        backend.save("locks", "plain", b"x")
        with pytest.raises(AlreadyExists):
            backend.save("locks", "plain", b"y", exclusive=True)
        assert backend.load("locks", "plain") == b"x"
        # and a removed object can be created again
        backend.remove("locks", "lock")
        backend.save("locks", "lock", b"again", exclusive=True)
        assert backend.load("locks", "lock") == b"again"

    def test_concurrent_exclusive_creates_exactly_one_wins(self, backend: Backend) -> None:
        for round_ in range(4):
            name = f"race-{round_}"
            payloads = [f"writer {i} ".encode() * 5000 for i in range(16)]

            def create(i: int, n: str = name, p: list[bytes] = payloads) -> None:
                backend.save("locks", n, p[i], exclusive=True)

            results = _race(16, create)
            winners = [i for i, r in enumerate(results) if r is None]
            losers = [r for r in results if r is not None]
            assert len(winners) == 1, results
            assert all(isinstance(r, AlreadyExists) for r in losers), losers
            assert backend.load("locks", name) == payloads[winners[0]]
            assert list(backend.list("locks", prefix=name)) == [name]

    # -- atomicity ---------------------------------------------------------------------------

    def test_readers_never_see_a_partial_object(self, backend: Backend) -> None:
        size = 3 << 20
        versions = [bytes([v]) * size for v in (0x41, 0x42)]
        backend.save("capsules", "obj", versions[0])
        stop = threading.Event()
        seen: list[bytes] = []
        bad: list[str] = []

        def reader() -> None:
            while not stop.is_set():
                blob = backend.load("capsules", "obj")
                if blob not in versions:
                    bad.append(f"{len(blob)} bytes, starting {blob[:4]!r}, ending {blob[-4:]!r}")
                seen.append(blob[:1])

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for i in range(12):
                backend.save("capsules", "obj", versions[i % 2])
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not bad, bad[:3]
        assert seen

    def test_an_exclusive_create_is_invisible_until_complete(self, backend: Backend) -> None:
        size = 3 << 20
        payload = b"\x5a" * size
        stop = threading.Event()
        bad: list[str] = []

        def reader(name: str) -> None:
            while not stop.is_set():
                try:
                    blob = backend.load("locks", name)
                except ObjectNotFound:
                    continue
                if blob != payload:
                    bad.append(f"{len(blob)} bytes")
                return

        for round_ in range(3):
            name = f"create-{round_}"
            stop.clear()
            t = threading.Thread(target=reader, args=(name,))
            t.start()
            try:
                backend.save("locks", name, payload, exclusive=True)
            finally:
                stop.set()
                t.join()
        assert not bad, bad

    # -- missing objects and bad names -------------------------------------------------------

    def test_missing_objects_raise_object_not_found(self, backend: Backend) -> None:
        with pytest.raises(ObjectNotFound, match="capsules/nope") as info:
            backend.load("capsules", "nope")
        assert isinstance(info.value, KeyError) and isinstance(info.value, RepositoryError)
        assert str(info.value).startswith("capsules/nope")  # the plain message, not KeyError's quoting
        with pytest.raises(ObjectNotFound, match="chunks/nope"):
            backend.load_into("chunks", "nope", memoryview(bytearray(3)))
        with pytest.raises(ObjectNotFound, match="workspaces/nope"):
            backend.remove("workspaces", "nope")
        assert backend.stat("chunks", "nope") is None

    def test_remove(self, backend: Backend) -> None:
        backend.save("chunks", "aa01", b"1")
        backend.save("chunks", "aa02", b"2")
        backend.remove("chunks", "aa01")
        assert backend.stat("chunks", "aa01") is None
        assert list(backend.list("chunks")) == ["aa02"]
        with pytest.raises(ObjectNotFound):
            backend.load("chunks", "aa01")
        with pytest.raises(ObjectNotFound):
            backend.remove("chunks", "aa01")
        backend.flush()
        assert self.reopen(backend).stat("chunks", "aa01") is None

    @pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
    def test_invalid_names_are_rejected(self, backend: Backend, name: str) -> None:
        ops: list[Callable[[], object]] = [
            lambda: backend.save("capsules", name, b"x"),
            lambda: backend.save("capsules", name, b"x", exclusive=True),
            lambda: backend.load("capsules", name),
            lambda: backend.load_into("capsules", name, memoryview(bytearray(1))),
            lambda: backend.stat("capsules", name),
            lambda: backend.remove("capsules", name),
        ]
        for op in ops:
            with pytest.raises(ValueError, match="invalid object name"):
                op()
        for kind in KINDS:
            assert list(backend.list(kind)) == []

    @pytest.mark.parametrize("kind", BAD_KINDS, ids=repr)
    def test_unknown_kinds_are_rejected(self, backend: Backend, kind: str) -> None:
        ops: list[Callable[[], object]] = [
            lambda: backend.save(kind, "name", b"x"),
            lambda: backend.load(kind, "name"),
            lambda: backend.load_into(kind, "name", memoryview(bytearray(1))),
            lambda: backend.stat(kind, "name"),
            lambda: list(backend.list(kind)),
            lambda: backend.remove(kind, "name"),
        ]
        for op in ops:
            with pytest.raises(ValueError, match="unknown object kind"):
                op()

    # -- listing -----------------------------------------------------------------------------

    def test_list_is_sorted_and_filters_by_prefix(self, backend: Backend) -> None:
        names = ["ff00", "0a1b", "0a2c", "b7", "0b", "cap_x.json"]
        for n in names:
            backend.save("chunks", n, n.encode())
        assert list(backend.list("chunks")) == sorted(names)
        assert list(backend.list("chunks", prefix="0a")) == ["0a1b", "0a2c"]
        assert list(backend.list("chunks", prefix="0a2c")) == ["0a2c"]
        assert list(backend.list("chunks", prefix="zz")) == []
        assert list(backend.list("capsules")) == []

    def test_list_returns_every_object_of_a_large_kind(self, backend: Backend) -> None:
        # More than one page of an S3 listing (1000 keys).
        names = [f"{i:04x}{'ab' * 30}" for i in range(1100)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: backend.save("chunks", n, b"."), names))
        assert list(backend.list("chunks")) == sorted(names)
        assert list(backend.list("chunks", prefix="030")) == [n for n in names if n.startswith("030")]

    # -- flush -------------------------------------------------------------------------------

    def test_flush_is_idempotent_and_keeps_every_save(self, backend: Backend) -> None:
        backend.flush()  # nothing pending
        for i in range(20):
            backend.save("chunks", f"{i:02x}ff", bytes([i]) * 100)
        backend.save("capsules", "cap_1.json", b"{}", exclusive=True)
        backend.flush()
        backend.flush()
        again = self.reopen(backend)
        for i in range(20):
            assert again.load("chunks", f"{i:02x}ff") == bytes([i]) * 100
        assert again.load("capsules", "cap_1.json") == b"{}"


class ChunkStoreConformance:
    """Content-addressed chunks over each backend: dedup, codecs, corruption."""

    CHUNK = 64 << 10

    def store(self, backend: Backend) -> ChunkStore:
        return ChunkStore(backend, chunk_size=self.CHUNK, workers=4)

    def test_round_trip_raw_and_zstd(self, backend: Backend) -> None:
        noise = os.urandom(5 * self.CHUNK + 123)  # does not compress: stored raw
        zeros = bytes(5 * self.CHUNK + 123)  # compresses a thousandfold: stored zstd
        stats = WriteStats()
        cs = self.store(backend)
        try:
            rec_noise, rec_zeros = cs.put_many([memoryview(noise), memoryview(zeros)], stats)
            assert rec_noise.codec == "raw" and rec_zeros.codec == "zstd"
            assert len(rec_noise.chunks) == len(rec_zeros.chunks) == 6
            assert all(h == chunk_hash(noise[i * self.CHUNK : (i + 1) * self.CHUNK]) for i, h in enumerate(rec_noise.chunks))
            stored = set(backend.list("chunks"))
            assert set(cs.names(rec_noise)) <= stored and set(cs.names(rec_zeros)) <= stored
            if not cs.keyed:  # keyed names say nothing, not even the codec
                assert all(n.endswith("-z") for n in cs.names(rec_zeros))
            # the five identical all-zero chunks are one object
            assert len(set(cs.names(rec_zeros))) == 2
            assert stats.logical == len(noise) + len(zeros)
            assert stats.written < len(noise) + len(zeros) // 100
            assert cs.get(rec_noise) == noise
            assert cs.get(rec_zeros) == zeros
            out = bytearray(len(noise))
            cs.get_into(rec_noise, memoryview(out))
            assert out == noise
            assert cs.exists(rec_noise) == [] and cs.exists(rec_zeros) == []
        finally:
            cs.close()

    def test_explicit_zstd_codec_and_empty_buffers(self, backend: Backend) -> None:
        cs = self.store(backend)
        try:
            stats = WriteStats()
            rec = cs.put(b"x" * 1000, stats, codec="zstd")
            assert rec.codec == "zstd" and cs.get(rec) == b"x" * 1000
            empty = cs.put(b"", stats)
            assert empty.size == 0 and empty.chunks == [] and cs.get(empty) == b""
        finally:
            cs.close()

    def test_unchanged_chunks_are_never_written_twice(self, backend: Backend) -> None:
        data = bytearray(os.urandom(8 * self.CHUNK))
        first = WriteStats()
        cs = self.store(backend)
        rec1 = cs.put(memoryview(data), first)
        cs.close()
        assert first.chunks_new == 8 and first.written == len(data)
        # a fresh store (nothing cached in memory) asks the backend
        second = WriteStats()
        cs = self.store(backend)
        rec2 = cs.put(memoryview(data), second)
        cs.close()
        assert rec2.chunks == rec1.chunks
        assert (second.chunks_new, second.written, second.chunks_reused) == (0, 0, 8)
        # one byte changed: exactly the chunk that holds it is new
        data[3 * self.CHUNK + 77] ^= 0xFF
        third = WriteStats()
        cs = self.store(backend)
        rec3 = cs.put(memoryview(data), third)
        cs.close()
        changed = [i for i, (a, b) in enumerate(zip(rec1.chunks, rec3.chunks, strict=True)) if a != b]
        assert changed == [3]
        assert (third.chunks_new, third.written, third.chunks_reused) == (1, self.CHUNK, 7)
        assert len(list(backend.list("chunks"))) == 9

    def _stored(self, backend: Backend, codec: str) -> tuple[ChunkStore, BufferRecord, bytes, str]:
        data = os.urandom(3 * self.CHUNK) if codec == "raw" else b"abcd" * (3 * self.CHUNK // 4)
        cs = self.store(backend)
        rec = cs.put(data, WriteStats(), codec=codec)
        return cs, rec, data, cs.names(rec)[1]

    @pytest.mark.parametrize("codec", ["raw", "zstd"])
    def test_a_flipped_byte_in_a_chunk_is_detected(self, backend: Backend, codec: str) -> None:
        cs, rec, _, name = self._stored(backend, codec)
        try:
            blob = bytearray(backend.load("chunks", name))
            blob[len(blob) // 2] ^= 0x01
            backend.save("chunks", name, memoryview(blob))
            with pytest.raises(IntegrityError, match=rf"chunk {name[:16]}… is corrupt"):
                cs.get(rec)
        finally:
            cs.close()

    def test_a_zstd_chunk_with_other_content_is_detected(self, backend: Backend) -> None:
        cs, rec, _, name = self._stored(backend, "zstd")
        try:
            # a valid frame, of the right size, of different bytes: only the hash can tell
            backend.save("chunks", name, zstandard.ZstdCompressor().compress(b"dcba" * (self.CHUNK // 4)))
            with pytest.raises(IntegrityError, match="does not match its hash"):
                cs.get(rec)
        finally:
            cs.close()

    def test_a_missing_chunk_is_reported(self, backend: Backend) -> None:
        cs, rec, _, name = self._stored(backend, "raw")
        try:
            backend.remove("chunks", name)
            assert cs.exists(rec) == []  # this store wrote it, and remembers that
            fresh = self.store(backend)
            assert fresh.exists(rec) == [name]
            fresh.close()
            with pytest.raises(ObjectNotFound, match=rf"chunk {name[:16]}… is missing"):
                cs.get(rec)
        finally:
            cs.close()

    def test_a_truncated_chunk_is_refused(self, backend: Backend) -> None:
        cs, rec, _, name = self._stored(backend, "raw")
        try:
            backend.save("chunks", name, backend.load("chunks", name)[:-1])
            with pytest.raises(ObjectNotFound, match="expected"):
                cs.get(rec)
        finally:
            cs.close()

    def test_a_buffer_of_the_wrong_size_is_refused(self, backend: Backend) -> None:
        cs, rec, data, _ = self._stored(backend, "raw")
        try:
            with pytest.raises(IntegrityError, match="were allocated"):
                cs.get_into(rec, memoryview(bytearray(len(data) - 1)))
        finally:
            cs.close()


# -- the same suites through an encrypted repository's layer ------------------------------------

TEST_KEYS_ID = "repo_00112233445566778899"


def fixed_keys() -> Any:
    from sojourn.repository.crypto import RepoKeys

    return RepoKeys(bytes(range(32)), TEST_KEYS_ID)


def sealed(plain: Backend) -> Backend:
    """``plain`` as an encrypted repository's objects are reached: sealed, no retries."""
    from sojourn.repository.crypto import Sealer
    from sojourn.repository.guarded import guard
    from sojourn.repository.retry import RetryPolicy

    return guard(plain, RetryPolicy(plain.url, budget=0), Sealer(fixed_keys()))


class SealedConformance(BackendConformance, ChunkStoreConformance):
    """Both suites again, every object sealed: a subclass provides ``new_plain_backend``."""

    @pytest.fixture
    def new_plain_backend(self) -> NewBackend:
        raise NotImplementedError("a sealed conformance subclass provides new_plain_backend")

    @pytest.fixture
    def new_backend(self, new_plain_backend: NewBackend) -> NewBackend:
        return lambda: sealed(new_plain_backend())

    def reopen(self, backend: Backend) -> Backend:
        return sealed(backend_for(backend.url))

    def store(self, backend: Backend) -> ChunkStore:
        return ChunkStore(backend, chunk_size=self.CHUNK, workers=4, naming=fixed_keys().chunk_name)

    def test_what_is_stored_is_sealed(self, backend: Backend) -> None:
        plain = backend.inner  # type: ignore[attr-defined]
        secret = b"the launch codes are 0000" * 100
        backend.save("capsules", "cap_x.json", secret)
        backend.save("workspaces", "event.ws_1.00000001", secret)
        stored = plain.load("capsules", "cap_x.json")
        assert stored.startswith(b"SJE\x01") and len(stored) == len(secret) + 32
        assert b"launch" not in stored and b"launch" not in plain.load("workspaces", "event.ws_1.00000001")
        assert backend.stat("capsules", "cap_x.json") == len(secret)
        backend.save("config", "config.json", b"{}")  # the config says how to open the rest: plain
        assert plain.load("config", "config.json") == b"{}"
        backend.save("config", "machines.toml", b"[machines.gpu]\npython = '/opt/py'\n")  # shared config: sealed
        assert b"/opt/py" not in plain.load("config", "machines.toml")

"""When memory is tight (or SOJOURN_DIRECT_IO=1), large objects go to the disk with O_DIRECT
through an aligned bounce buffer and large reads drop their page-cache copy; otherwise, and
for small objects and filesystems without O_DIRECT, the page cache is used. Either way an
object has exactly its bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sojourn.repository import local
from sojourn.repository.local import LocalBackend

SIZES = [local._DIRECT_MIN, 4 << 20, (4 << 20) + 1, (5 << 20) + 123, 10 << 20]


def _roundtrip(b: LocalBackend, sizes: list[int]) -> None:
    for i, n in enumerate(sizes):
        # Writable buffers (arrays, tensors) and read-only ones (bytes) take different copies.
        data: bytes | bytearray = os.urandom(n) if i % 2 else bytearray(os.urandom(n))
        b.save("chunks", f"{i:02x}" + "ab" * 31, memoryview(data)[: n])
        got = b.load("chunks", f"{i:02x}" + "ab" * 31)
        assert len(got) == n and got == data


def _direct_ok(path: Path) -> bool:
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = path / ".probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError:
        return False
    probe.unlink()
    return True


def test_large_objects_are_written_direct_with_exact_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOJOURN_DIRECT_IO", "1")
    if not _direct_ok(tmp_path):
        pytest.skip(f"{tmp_path} is on a filesystem without O_DIRECT")
    b = LocalBackend(tmp_path / "repo")
    b.create()
    b.save("chunks", "00" + "cd" * 31, b"small")  # under the threshold: page cache, not tried
    assert b._direct is None
    _roundtrip(b, SIZES)
    assert b._direct is True
    # Nothing is left behind: every temporary was renamed into place.
    assert not [p for p in (tmp_path / "repo").rglob(".tmp-*")]


@pytest.mark.parametrize("refuses_at", ["open", "write"])
def test_a_filesystem_that_refuses_o_direct_gets_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuses_at: str
) -> None:
    # Faked: every filesystem here (ext4, and tmpfs on this kernel) takes O_DIRECT, so the
    # refusal some filesystems give (EINVAL at open, or at the first unaligned write) is
    # played by wrapping os.open / os.write.
    import errno

    real_open, real_write = os.open, os.write
    direct_fds: set[int] = set()

    def fake_open(path: object, flags: int, *a: object) -> int:
        if flags & os.O_DIRECT and refuses_at == "open":
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags, *a)  # type: ignore[arg-type]
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        else:
            direct_fds.discard(fd)  # the number of a closed direct file, reused
        return fd

    def fake_write(fd: int, data: object) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)  # type: ignore[arg-type]

    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    monkeypatch.setenv("SOJOURN_DIRECT_IO", "1")
    monkeypatch.setattr(local.os, "open", fake_open)
    monkeypatch.setattr(local.os, "write", fake_write)
    b = LocalBackend(tmp_path / "repo")
    b.create()
    _roundtrip(b, SIZES[:3])
    assert b._direct is False
    assert not [p for p in (tmp_path / "repo").rglob(".tmp-*")]


def test_switched_off_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOJOURN_DIRECT_IO", "0")
    b = LocalBackend(tmp_path / "repo")
    b.create()
    _roundtrip(b, SIZES[:2])
    assert b._direct is None  # never tried


def test_memory_headroom_is_read_from_this_machine() -> None:
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo")
    room = local.memory_headroom()
    assert room is not None
    avail, total = room
    assert 0 <= avail <= total and total > 64 << 20


@pytest.mark.parametrize("tight", [True, False])
def test_auto_bypasses_the_cache_only_when_memory_is_tight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tight: bool
) -> None:
    # Faked: the memory this machine has free cannot be set by a test, so the headroom the
    # policy reads is replaced (1 GiB of 24 free, or 20 of 24).
    if not _direct_ok(tmp_path):
        pytest.skip(f"{tmp_path} is on a filesystem without O_DIRECT")
    monkeypatch.delenv("SOJOURN_DIRECT_IO", raising=False)
    monkeypatch.setattr(local, "memory_headroom", lambda: ((1 if tight else 20) << 30, 24 << 30))
    monkeypatch.setattr(local, "_tight_seen", [-1.0, False])
    b = LocalBackend(tmp_path / "repo")
    b.create()
    _roundtrip(b, SIZES[:2])
    assert b._direct is (True if tight else None)


def _resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache, asked of the kernel with mincore(2)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # never written: the file's pages
        try:
            anchor = ctypes.c_char.from_buffer(mm)
            pages = -(-size // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec) != 0:
                pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
            del anchor
            return sum(v & 1 for v in vec)
        finally:
            mm.close()


@pytest.mark.parametrize("direct_io", ["1", "0", "auto"])
def test_large_reads_leave_no_copy_in_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_io: str
) -> None:
    monkeypatch.setenv("SOJOURN_DIRECT_IO", direct_io)
    b = LocalBackend(tmp_path / "repo")
    b.create()
    data = os.urandom(8 << 20)
    name = "ef" * 32
    b.save("chunks", name, data)
    path = tmp_path / "repo" / "chunks" / name[:2] / name
    assert path.read_bytes() == data  # a plain read: now it is cached
    cached = _resident_pages(path)
    assert cached > 0
    out = bytearray(len(data))
    b.load_into("chunks", name, memoryview(out))
    assert out == data
    if direct_io == "1" or (direct_io == "auto" and local.memory_tight()):
        assert _resident_pages(path) == 0  # dropped once read: the program holds the bytes now
    else:
        assert _resident_pages(path) == cached

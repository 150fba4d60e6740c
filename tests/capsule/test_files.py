"""Workspace files and open files: capture in one process, restore in a fresh one."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

import sojourn
from sojourn.capsule import format as fmt
from sojourn.capsule.workspace_files import load_entries, materialize, snapshot
from sojourn.errors import CaptureError, IntegrityError, RestoreError
from sojourn.repository.chunks import ChunkStore, WriteStats
from sojourn.repository.memory import MemoryBackend
from sojourn.repository.repo import open_repository
from tests.conftest import SRC, last_json, run_py


def _tree(root: Path) -> dict[str, object]:
    """Every file and link under ``root``: content hash and mode, or link target."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(p.lstat().st_mode):
                out[rel] = (blake3.blake3(p.read_bytes()).hexdigest(), oct(stat.S_IMODE(p.stat().st_mode)))
    return out


def _capture(tmp_path: Path, setup: str, repo: str, ws: Path, parent: str | None = None) -> str:
    proc = run_py(
        "import sys, os, json, sojourn\nWS = sys.argv[2]\n"
        + setup
        + "\nref = sojourn.capture(globals(), sys.argv[1], files=WS, parent=sys.argv[3] or None)"
        + "\nprint(ref.id)\n",
        repo,
        str(ws),
        parent or "",
        cwd=tmp_path,
    )
    return proc.stdout.split()[-1]


def _restore(tmp_path: Path, capsule: str, repo: str, dest: Path, checks: str) -> dict:
    proc = run_py(
        "import sys, os, json, sojourn\nDEST = sys.argv[3]\n"
        "ns = sojourn.restore(sys.argv[2], sys.argv[1], files_to=DEST, into=globals())\nout = {}\n"
        + checks
        + "\nprint(json.dumps(out))\n",
        repo,
        capsule,
        str(dest),
        cwd=tmp_path,
    )
    return last_json(proc)  # type: ignore[return-value]


def _files_json(repo: str, capsule: str) -> dict:
    with open_repository(repo) as r:
        files = fmt.load_manifest(r, capsule).files
    assert files is not None
    return files


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "data" / "nested" / "deep").mkdir(parents=True)
    (root / "data" / "nested" / "deep" / "table.bin").write_bytes(os.urandom(70_000))
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o751)
    (root / "secret.txt").write_text("s3cr3t")
    os.chmod(root / "secret.txt", 0o600)
    (root / "frozen.txt").write_text("read only")
    os.chmod(root / "frozen.txt", 0o444)
    (root / "empty").write_bytes(b"")
    (root / "notes.md").write_text("héllo wörld €\n" * 100, encoding="utf-8")
    return root


def test_files_round_trip_into_another_directory(tmp_path: Path, repo: str, ws: Path) -> None:
    # Links inside are kept as links; what points outside, and what is rebuilt or
    # installed at the destination, is left out.
    os.symlink("data/nested/deep/table.bin", ws / "latest")
    os.symlink("data/nested", ws / "nested-link")
    os.symlink(str(ws / "notes.md"), ws / "abs-link")  # absolute but inside: made relative
    os.symlink("/etc/hostname", ws / "outside-link")
    os.symlink("../../elsewhere", ws / "data" / "escapes")
    for skipped in ("__pycache__/m.cpython-311.pyc", ".git/HEAD", ".venv/bin/python", ".venv3.12/x", "data/__pycache__/y.pyc"):
        (ws / skipped).parent.mkdir(parents=True, exist_ok=True)
        (ws / skipped).write_text("skip me")
    (ws / "top.pyc").write_bytes(b"\x00")
    os.mkfifo(ws / "control.fifo")
    expected = {k: v for k, v in _tree(ws).items() if not k.startswith(("__pycache__", ".git", ".venv", "data/__pycache__"))}
    del expected["top.pyc"], expected["outside-link"], expected["data/escapes"]
    expected["abs-link"] = ("link", "notes.md")
    inner_repo = str(ws / "repo")  # the repository inside the workspace is not captured

    capsule = _capture(tmp_path, "x = 42\n", inner_repo, ws)
    files = _files_json(inner_repo, capsule)
    assert files["files"] == 6 and files["links"] == 3
    assert files["bytes"] == sum((ws / p).stat().st_size for p, v in expected.items() if v[0] != "link")
    assert any("control.fifo" in n for n in files["skipped"])
    assert any("outside-link" in n for n in files["skipped"]) and any("data/escapes" in n for n in files["skipped"])

    dest = tmp_path / "elsewhere" / "restored"
    out = _restore(
        tmp_path, capsule, inner_repo, dest,
        "out['x'] = x\nout['mtime'] = os.stat(os.path.join(DEST, 'notes.md')).st_mtime_ns",
    )
    assert out["x"] == 42
    assert _tree(dest) == expected
    assert out["mtime"] == (ws / "notes.md").stat().st_mtime_ns
    assert (dest / "latest").read_bytes() == (ws / "data/nested/deep/table.bin").read_bytes()
    assert not list(dest.rglob("*.sojourn-tmp"))


def test_restore_leaves_identical_files_alone(tmp_path: Path, repo: str, ws: Path) -> None:
    capsule = _capture(tmp_path, "", repo, ws)
    inode = (ws / "notes.md").stat().st_ino
    (ws / "run.sh").write_text("changed after the capture")
    (ws / "data" / "nested" / "deep" / "table.bin").unlink()
    before = _tree(ws)
    _restore(tmp_path, capsule, repo, ws, "")
    after = _tree(ws)
    assert (ws / "notes.md").stat().st_ino == inode  # identical: not rewritten
    assert (ws / "run.sh").read_text() == "#!/bin/sh\necho hi\n" and after["run.sh"][1] == "0o751"
    assert "data/nested/deep/table.bin" in after and after["notes.md"] == before["notes.md"]


def test_incremental_capture_reads_only_changed_files(tmp_path: Path, repo: str, ws: Path) -> None:
    (ws / "big.bin").write_bytes(os.urandom(3 << 20))
    first = sojourn.capture({"v": 1}, repo, files=str(ws))
    assert _files_json(repo, first.id)["files_read"] == 7
    (ws / "notes.md").write_text("edited", encoding="utf-8")
    (ws / "data" / "new.txt").write_text("new file")
    second = sojourn.capture({"v": 2}, repo, files=str(ws), parent=first.id)
    files = _files_json(repo, second.id)
    assert (files["files"], files["files_read"], files["files_reused"]) == (8, 2, 6)
    assert second.bytes_written < 64 << 10, second.bytes_written  # not the 3 MiB again
    assert second.parent == first.id

    # Without a parent every file is read again, but unchanged chunks are still not written.
    third = sojourn.capture({"v": 3}, repo, files=str(ws))
    assert _files_json(repo, third.id)["files_read"] == 8 and third.bytes_written < 64 << 10

    dest = tmp_path / "dest"
    out = _restore(tmp_path, second.id, repo, dest, "out['v'] = v")
    assert out["v"] == 2 and _tree(dest) == _tree(ws)


def test_large_files_stream_in_aligned_chunks(tmp_path: Path) -> None:
    backend = MemoryBackend(f"files-{os.getpid()}-{id(tmp_path)}")
    backend.create()
    store = ChunkStore(backend, chunk_size=1024)
    root = tmp_path / "ws"
    root.mkdir()
    data = os.urandom(50_000) + bytes(30_000)  # over 16 chunks: streamed in groups
    (root / "large.bin").write_bytes(data)
    (root / "exact.bin").write_bytes(os.urandom(16 * 1024 * 2))  # ends on a chunk boundary
    try:
        stats = WriteStats()
        files = snapshot(root, store, stats)
        entries = {e["path"]: e for e in load_entries(files, store)}
        whole = store.put(data, WriteStats(), codec=entries["large.bin"]["codec"])
        assert entries["large.bin"]["chunks"] == whole.chunks
        assert entries["large.bin"]["hash"] == blake3.blake3(data).hexdigest()
        assert entries["exact.bin"]["size"] == 32 * 1024 and len(entries["exact.bin"]["chunks"]) == 32
        dest = tmp_path / "dest"
        materialize(files, store, dest)
        assert (dest / "large.bin").read_bytes() == data
        assert (dest / "exact.bin").read_bytes() == (root / "exact.bin").read_bytes()
    finally:
        store.close()


@pytest.mark.parametrize(
    "entry",
    [
        {"path": "../escape.txt"},
        {"path": "/etc/evil"},
        {"path": "a/../../evil"},
        {"path": "ok/./x"},
        {"path": "link", "type": "link", "target": "../../etc"},
        {"path": "link", "type": "link", "target": "/etc/passwd"},
    ],
)
def test_materialize_refuses_paths_outside(tmp_path: Path, entry: dict) -> None:
    backend = MemoryBackend(f"evil-{os.getpid()}-{id(tmp_path)}")
    backend.create()
    store = ChunkStore(backend)
    good = {"path": "good.txt", "size": 2, "mode": 0o644, "hash": blake3.blake3(b"ok").hexdigest(), "codec": "raw"}
    good["chunks"] = store.put(b"ok", WriteStats(), codec="raw").chunks
    if entry.get("type") != "link":
        entry = {**good, **entry}
    listing = json.dumps([good, entry]).encode()
    files = {"version": 1, "manifest": store.put(listing, WriteStats(), codec="zstd").to_json()}
    dest = tmp_path / "dest"
    with pytest.raises(IntegrityError, match="workspace"):
        materialize(files, store, dest)
    assert not dest.exists() or not any(dest.iterdir())  # nothing written
    assert not (tmp_path / "escape.txt").exists()
    store.close()


def test_materialize_refuses_a_link_in_the_destination_that_leads_outside(tmp_path: Path) -> None:
    backend = MemoryBackend(f"redirect-{os.getpid()}-{id(tmp_path)}")
    backend.create()
    store = ChunkStore(backend)
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("x")
    files = snapshot(root, store, WriteStats())
    dest = tmp_path / "dest"
    dest.mkdir()
    (tmp_path / "victim").mkdir()
    os.symlink(tmp_path / "victim", dest / "sub")
    with pytest.raises(RestoreError, match="outside"):
        materialize(files, store, dest)
    assert not (tmp_path / "victim" / "f.txt").exists()
    store.close()


def test_open_readers_continue_at_their_offset(tmp_path: Path, repo: str, ws: Path) -> None:
    lines = [f"línea {i}: é€😀 {'x' * (i % 7)}\n" for i in range(3000)]
    (ws / "utf8.txt").write_text("".join(lines), encoding="utf-8")
    (ws / "crlf.txt").write_bytes(b"one\r\ntwo\r\nthree\rfour\n")
    setup = """
r = open(os.path.join(WS, "utf8.txt"), encoding="utf-8")
first = [r.readline(), r.readline(), r.read(3)]
looped = open(os.path.join(WS, "utf8.txt"), encoding="utf-8")
for i, line in enumerate(looped):
    if i == 1500:
        break
raw_nl = open(os.path.join(WS, "crlf.txt"), newline="")
raw_nl.readline()
universal = open(os.path.join(WS, "crlf.txt"))
universal.readline()
b = open(os.path.join(WS, "data/nested/deep/table.bin"), "rb")
b.read(5000)
unbuffered = open(os.path.join(WS, "data/nested/deep/table.bin"), "rb", buffering=0)
unbuffered.read(70)
alias = b  # the same object twice
buf_of_r = r.buffer
"""
    capsule = _capture(tmp_path, setup, repo, ws)
    out = _restore(
        tmp_path, capsule, repo, tmp_path / "dest",
        """
out['r'] = [r.readline(), r.readline()]
out['r_mode'] = [r.mode, r.encoding, r.name]
out['looped_tell'] = looped.tell() > 0  # tell() works again after the restore
out['looped'] = next(looped)
out['raw_nl'] = [raw_nl.readline(), raw_nl.readline()]
out['universal'] = [universal.readline(), universal.readline()]
out['b'] = b.read(4).hex()
out['unbuffered'] = unbuffered.read(2).hex()
out['alias'] = alias is b and buf_of_r is r.buffer
out['types'] = [type(x).__name__ for x in (r, b, unbuffered)]
""",
    )
    table = (ws / "data/nested/deep/table.bin").read_bytes()
    assert out["r"] == [lines[2][3:], lines[3]]
    assert out["r_mode"][:2] == ["r", "utf-8"] and out["r_mode"][2] == str(tmp_path / "dest" / "utf8.txt")
    assert out["looped"] == lines[1501] and out["looped_tell"]
    assert out["raw_nl"] == ["two\r\n", "three\r"]
    assert out["universal"] == ["two\n", "three\n"]
    assert out["b"] == table[5000:5004].hex() and out["unbuffered"] == table[70:72].hex()
    assert out["alias"] and out["types"] == ["TextIOWrapper", "BufferedReader", "FileIO"]


def test_open_writers_keep_their_data_and_are_not_truncated(tmp_path: Path, repo: str, ws: Path) -> None:
    setup = """
w = open(os.path.join(WS, "out.log"), "w", encoding="utf-8")
w.write("before é\\n")   # not flushed: the capture flushes it
a = open(os.path.join(WS, "app.log"), "a")
a.write("a1\\n")
wb = open(os.path.join(WS, "data/out.bin"), "wb")
wb.write(b"12345")
x = open(os.path.join(WS, "fresh.txt"), "x")
x.write("created")
rw = open(os.path.join(WS, "notes.md"), "r+", encoding="utf-8")
rw.readline()
rw.seek(rw.tell())  # text files write at the read-ahead position unless told where
rw.write("PATCH")
"""
    capsule = _capture(tmp_path, setup, repo, ws)
    dest = tmp_path / "dest"
    out = _restore(
        tmp_path, capsule, repo, dest,
        """
out['modes'] = [w.mode, a.mode, wb.mode, x.mode, rw.mode]
out['content_before'] = open(os.path.join(DEST, 'out.log'), encoding='utf-8').read()
w.write("after\\n"); w.close()
a.write("a2\\n"); a.close()
wb.write(b"678"); wb.close()
x.write(" more"); x.close()
out['rw_next'] = rw.readline()
rw.close()
""",
    )
    assert out["modes"] == ["w", "a", "wb", "x", "r+"]
    assert out["content_before"] == "before é\n"
    assert (dest / "out.log").read_text(encoding="utf-8") == "before é\nafter\n"
    assert (dest / "app.log").read_text() == "a1\na2\n"
    assert (dest / "data/out.bin").read_bytes() == b"12345678"
    assert (dest / "fresh.txt").read_text() == "created more"
    # What the capturing process would have read next, simulated on a copy.
    copy = tmp_path / "copy.md"
    copy.write_text("héllo wörld €\n" * 100, encoding="utf-8")  # as the fixture wrote it
    with open(copy, "r+", encoding="utf-8") as f:
        f.readline()
        f.seek(f.tell())
        f.write("PATCH")
        f.flush()  # as the capture did
        expected_next = f.readline()
    assert out["rw_next"] == expected_next == "o wörld €\n"
    assert (dest / "notes.md").read_bytes() == copy.read_bytes()


def test_files_outside_the_workspace_cannot_travel(tmp_path: Path, repo: str, ws: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("elsewhere")
    read_end, write_end = os.pipe()
    with open(outside) as f, open(ws / "fine.txt", "w") as inside, os.fdopen(write_end, "w") as pipe:
        holder = {"nested": [f]}
        with pytest.raises(CaptureError) as err:
            sojourn.capture({"holder": holder, "inside": inside, "pipe": pipe}, repo, files=str(ws))
    os.close(read_end)
    problems = {p.path: p for p in err.value.problems}
    assert set(problems) == {"holder['nested'][0]", "pipe"}, problems
    assert str(outside) in problems["holder['nested'][0]"].reason
    assert "file outside the workspace" in problems["holder['nested'][0]"].reason
    assert "pipe" in problems["pipe"].reason
    assert str(outside) in str(err.value)


def test_closed_memory_and_standard_streams(tmp_path: Path, repo: str, ws: Path) -> None:
    setup = """
closed_text = open(os.path.join(WS, "notes.md"), encoding="latin-1")
closed_text.close()
closed_bin = open(os.path.join(WS, "empty"), "ab")
closed_bin.close()
out_stream = sys.stdout
err_buffer = sys.stderr.buffer
sink = open(os.devnull, "w")
import io
mem_text = io.TextIOWrapper(io.BytesIO("é\\nβ\\n€\\n".encode()), encoding="utf-8")
mem_text.readline()
mem_buf = io.BufferedReader(io.BytesIO(b"0123456789"))
mem_buf.read(3)
"""
    capsule = _capture(tmp_path, setup, repo, ws)
    out = _restore(
        tmp_path, capsule, repo, tmp_path / "dest",
        """
out['closed'] = [closed_text.closed, type(closed_text).__name__, closed_text.encoding, closed_text.mode,
                 closed_bin.closed, type(closed_bin).__name__, closed_bin.mode]
out['std'] = out_stream is sys.stdout and err_buffer is sys.stderr.buffer
sink.write("nothing")
out['sink'] = sink.name
out['mem'] = [mem_text.readline(), mem_buf.read(2).decode()]
""",
    )
    assert out["mem"] == ["β\n", "34"]
    assert out["closed"] == [True, "TextIOWrapper", "latin-1", "r", True, "BufferedWriter", "ab"]
    assert out["std"] and out["sink"] == os.devnull


def test_verify_and_inspect_show_files(tmp_path: Path, repo: str, ws: Path) -> None:
    capsule = _capture(tmp_path, 'log = open(os.path.join(WS, "run.log"), "w")\nlog.write("x")\n', repo, ws)
    report = sojourn.verify(capsule, repo)
    assert report.ok, report.error

    info = sojourn.inspect(capsule, repo)
    by_path = {f["path"]: f for f in info.files}
    assert by_path["run.sh"]["mode"] == 0o751 and by_path["run.log"]["size"] == 1
    assert by_path["notes.md"]["hash"] == blake3.blake3((ws / "notes.md").read_bytes()).hexdigest()

    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cli = [sys.executable, "-m", "sojourn.cli.main", "inspect", capsule, "--repo", repo]
    text = subprocess.run(cli, capture_output=True, text=True, env=env, check=True).stdout
    assert "data/nested/deep/table.bin" in text and "0o751" in text and "run.log" in text
    doc = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env, check=True).stdout)
    assert {f["path"] for f in doc["files"]} >= {"run.sh", "run.log", "empty", "notes.md"}


def test_newline_argument_is_recovered(tmp_path: Path) -> None:
    from sojourn.capsule.reducers.files import _newline, _text_position

    p = tmp_path / "nl.txt"
    p.write_bytes(b"a\r\nb\rc\nd\n" * 5000)
    for newline in (None, "", "\n", "\r", "\r\n"):
        for mode in ("r", "r+", "a", "w"):
            target = p if mode != "w" else tmp_path / "w.txt"
            with open(target, mode, newline=newline) as f:
                if f.readable():
                    next(f)
                    _text_position(f)  # re-enables tell() after next()
                    f.readline()
                assert _newline(f) == newline, (newline, mode)
    with io.TextIOWrapper(io.BytesIO(b"x\ny\n"), newline="") as f:
        assert _newline(f) == ""
